"""The predictor artifact: assemble per-layer fits into one Predictor file."""

from __future__ import annotations

import torch
from torch import nn

from base_sglang.calibration.fit import LayerFit
from base_sglang.core import Predictor, PredictorMeta
from base_sglang.hf import norm_topk_prob


def assemble(model: nn.Module, fits: dict[int, LayerFit], model_id: str,
             calibration: dict, fit_stats: dict[str, dict[str, float]]) -> Predictor:
    """Stack per-layer fits (ordered by layer id) into a Predictor and validate it against the model."""
    cfg = model.config
    layers = sorted(fits)
    first = fits[layers[0]]
    meta = PredictorMeta(
        architecture=cfg.model_type,
        model_id=model_id,
        num_layers=int(cfg.num_hidden_layers),
        moe_layers=layers,
        hidden_size=int(cfg.hidden_size),
        num_experts=int(first.weight.shape[0]),
        top_k=int(cfg.num_experts_per_tok),
        norm_topk_prob=norm_topk_prob(cfg),
        calibration=calibration,
        fit_stats=fit_stats,
    )

    def stack(name):
        return torch.stack([getattr(fits[j], name).float().cpu() for j in layers])

    pred = Predictor(meta=meta, weight=stack("weight"), bias=stack("bias"),
                     expert_freq=stack("expert_freq"), expert_norm=stack("expert_norm"),
                     sere_sim=stack("sere_sim"), exfold_coef=stack("exfold_coef"),
                     exfold_loss=stack("exfold_loss"))
    pred.validate(cfg)
    return pred

"""Model loading and the predictor artifact: assemble per-layer fits into one Predictor file."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from base_sglang.calibration.fit import LayerFit
from base_sglang.core import Predictor, PredictorMeta
from base_sglang.engine.moe_hook import find_moe_blocks, norm_topk_prob

SUPPORTED = ("qwen3_moe", "qwen2_moe", "olmoe", "mixtral", "deepseek_v2")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but no CUDA device is available")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device: must be cpu, cuda or cuda:N, got {device!r}")
    return torch.device(device)


def load_model(path: str | Path, device: str = "cpu", dtype: str | None = None):
    """(model, tokenizer) from a local Hugging Face checkpoint of a supported MoE family."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model: {path} is not a Hugging Face checkpoint (no config.json)")
    cfg = AutoConfig.from_pretrained(str(path))
    if cfg.model_type not in SUPPORTED:
        raise ValueError(f"model: model_type {cfg.model_type!r} is not supported; supported: {SUPPORTED}")
    dev = resolve_device(device)
    dtype = dtype or ("float32" if dev.type == "cpu" else "bfloat16")
    if dtype not in DTYPES:
        raise ValueError(f"dtype: must be one of {tuple(DTYPES)}, got {dtype!r}")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype]).to(dev).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return model, tokenizer


def moe_blocks(model: nn.Module) -> dict[int, nn.Module]:
    blocks = find_moe_blocks(model)
    if not blocks:
        raise ValueError(f"model: no MoE blocks found in {type(model).__name__}")
    return blocks


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

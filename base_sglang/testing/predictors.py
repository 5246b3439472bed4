"""Synthetic predictor files: random weights of the right shape (they exercise the BASE code path,
they predict nothing), with the baselines' statistics when asked. One builder for tests and
benchmarks."""

from __future__ import annotations

import torch

from ..core import Predictor, PredictorMeta


def random_predictor(num_experts: int, hidden_size: int, top_k: int, layers=(0,), *,
                     num_layers: int | None = None, seed: int = 0, scale: float = 0.1,
                     bias_scale: float = 1.0, stats: bool = False,
                     architecture: str = "Qwen3MoeForCausalLM", model_id: str = "synthetic",
                     norm_topk_prob: bool = True, calibration: dict | None = None) -> Predictor:
    """A Predictor over `layers` (model layer ids) with weight ~ scale * N(0, 1), bias ~
    bias_scale * N(0, 1); stats=True adds SERE similarity, ExFold coefficients/losses, expert
    frequencies and norms of a plausible shape (symmetric similarity with unit diagonal, loss 1e30
    and coefficient 1 on the diagonal)."""
    E, H, n = num_experts, hidden_size, len(layers)
    g = torch.Generator().manual_seed(seed)
    meta = PredictorMeta(architecture=architecture, model_id=model_id,
                         num_layers=num_layers if num_layers is not None else max(layers) + 1,
                         moe_layers=list(layers), hidden_size=H, num_experts=E, top_k=top_k,
                         norm_topk_prob=norm_topk_prob,
                         calibration=calibration or {"synthetic": True, "seed": seed})
    weight = torch.randn(n, E, H, generator=g) * scale  # [L, E, H]
    bias = torch.randn(n, E, generator=g) * bias_scale  # [L, E]
    kw = {}
    if stats:
        sim = torch.rand(n, E, E, generator=g)
        sim = (sim + sim.transpose(1, 2)) / 2
        sim[:, torch.arange(E), torch.arange(E)] = 1.0
        loss = torch.rand(n, E, E, generator=g)
        loss[:, torch.arange(E), torch.arange(E)] = 1e30
        coef = torch.rand(n, E, E, generator=g) * 2 - 0.5
        coef[:, torch.arange(E), torch.arange(E)] = 1.0
        freq = torch.rand(n, E, generator=g)
        kw = dict(expert_freq=freq / freq.sum(-1, keepdim=True),
                  expert_norm=torch.rand(n, E, generator=g) + 0.5,
                  sere_sim=sim, exfold_coef=coef, exfold_loss=loss)
    return Predictor(meta=meta, weight=weight, bias=bias, **kw)

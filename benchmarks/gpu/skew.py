"""Skewed routing for dummy-weight runs: scale each router (gate) row by a per-expert factor.

Random router weights route near-uniformly (B=16 touches ~82 of 128 experts per layer with top-8).
Top-k is invariant to one common scale of the logits, so the knob is the SPREAD of per-expert
scales: row u of layer l's gate is multiplied by s_u = exp(-gamma * r_lu / E), r_l a random
permutation of 0..E-1 per layer. An expert with a larger scale has wider logits and lands in the
top-k more often, whatever the absolute size of the hidden states. With Gaussian-like logits and
E=128, top-8: gamma 0 -> union ~83 at B=16, 1 -> ~70, 2 -> ~55, 2.5 -> ~51, 3 -> ~48
(tests/benchmarks checks the direction on a tiny model; the GPU run reports the measured union).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def moe_gates(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, weight [E, H]) of every MoE block's router: modules with a `gate` and `experts`."""
    found = []
    for name, module in model.named_modules():
        gate = getattr(module, "gate", None)
        if gate is None or getattr(module, "experts", None) is None:
            continue
        weight = getattr(gate, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() == 2:
            found.append((f"{name}.gate" if name else "gate", weight))
    return found


def skew_router(model: nn.Module, gamma: float, seed: int = 0) -> dict:
    """Scale every router row in place (before CUDA-graph capture); returns what was done."""
    if not math.isfinite(gamma) or gamma < 0:
        raise ValueError(f"skew gamma: must be a finite number >= 0, got {gamma}")
    gates = moe_gates(model)
    if not gates:
        raise ValueError("skew: found no MoE router (a module with .gate.weight [E, H] and "
                         ".experts) in the model")
    g = torch.Generator().manual_seed(seed)
    for _, weight in gates:
        num_e = weight.shape[0]
        rank = torch.randperm(num_e, generator=g).float()  # [E]
        scale = torch.exp(-gamma * rank / num_e)  # [E] in (exp(-gamma), 1]
        with torch.no_grad():
            weight.mul_(scale.to(weight.device, weight.dtype)[:, None])  # [E, H]
    return {"gamma": gamma, "seed": seed, "routers": len(gates),
            "num_experts": int(gates[0][1].shape[0]),
            "scale_min": math.exp(-gamma * (gates[0][1].shape[0] - 1) / gates[0][1].shape[0]),
            "scale_max": 1.0}

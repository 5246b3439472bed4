"""Tiny inputs shared by the kernel tests: routing, a synthetic predictor, expert weights."""

from __future__ import annotations

import torch

from base_sglang.core import Predictor
from base_sglang.testing.predictors import random_predictor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def routing(T: int, E: int, K: int, *, seed: int = 0, one_expert: bool = False,
            norm: bool = True, id_dtype=torch.int64):
    """Router logits [T, E] fp32 and the model's top-k (ids [T, K], weights [T, K] fp32)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, E, generator=g)
    if one_expert:  # every token routes expert 0 first
        logits[:, 0] += 20.0
    w, ids = torch.softmax(logits, -1).topk(K, -1)
    if norm:
        w = w / w.sum(-1, keepdim=True)
    return logits.to(DEVICE), ids.to(id_dtype).to(DEVICE), w.to(DEVICE)


def predictor(E: int, H: int, *, seed: int = 0, layers=(0,)) -> Predictor:
    return random_predictor(E, H, 0, layers, num_layers=len(layers), seed=seed,
                            bias_scale=0.1, architecture="synthetic").to(DEVICE)


def experts(E: int, H: int, I: int, *, seed: int = 0):  # noqa: E741
    """bf16 gate_up [E, 2I, H] and down [E, H, I] (transformers 5 layout)."""
    g = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(E, 2 * I, H, generator=g) * H ** -0.5).bfloat16().to(DEVICE)
    down = (torch.randn(E, H, I, generator=g) * I ** -0.5).bfloat16().to(DEVICE)
    return gate_up, down

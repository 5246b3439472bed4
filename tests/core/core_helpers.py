"""Routing fixtures and slow, loop-based references for the selection core."""

from __future__ import annotations

import torch

from base_sglang.core import Predictor
from base_sglang.testing.predictors import random_predictor


def make_routing(T: int, E: int, K: int, *, norm_topk: bool = True, skew: float = 1.0,
                 dtype=torch.int64, seed: int = 0):
    """Router logits [T,E], model top-k ids [T,K] and weights [T,K] as a Qwen3-style router makes them."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, E, generator=g) * skew + torch.linspace(1.0, 0.0, E) * skew
    p = torch.softmax(logits, -1)
    w, ids = torch.topk(p, K, dim=-1)
    if norm_topk:
        w = w / w.sum(-1, keepdim=True)
    return logits, ids.to(dtype), w


def make_predictor(E: int, H: int, K: int, layers=(0,), seed: int = 0, with_stats: bool = True):
    return random_predictor(E, H, K, layers, seed=seed, scale=0.3, bias_scale=0.3,
                            stats=with_stats, model_id="test")


def base_scores_ref(pred: Predictor, layer: int, hidden, ids, w, real):
    """D_u = sum over real routed pairs of w^2 exp(2 (<z,a_u> + b_u)), by explicit loops."""
    j = pred.slot(layer)
    D = torch.zeros(pred.meta.num_experts, dtype=torch.float64)
    for t in range(ids.shape[0]):
        if not real[t]:
            continue
        for k in range(ids.shape[1]):
            u = int(ids[t, k])
            yhat = float(hidden[t].double() @ pred.weight[j, u].double() + pred.bias[j, u])
            D[u] += float(w[t, k]) ** 2 * torch.exp(torch.tensor(2 * yhat, dtype=torch.float64))
    return D


def backfill_ref(logits, ids, kept: set[int], K: int):
    """First K experts of (own top-k, then the rest by logit) that are in `kept`, -1 padded."""
    out = []
    for t in range(ids.shape[0]):
        own = [int(x) for x in ids[t]]
        rest = [int(x) for x in torch.sort(logits[t].float(), descending=True, stable=True).indices]
        order = own + [e for e in rest if e not in own]
        row = [e for e in order if e in kept][:K]
        out.append(row + [-1] * (K - len(row)))
    return torch.tensor(out)

"""The folded router's test inputs and its check against the core (tests of base_route_select and
base_route_split)."""

from __future__ import annotations

import torch
from kernel_helpers import DEVICE, W_ATOL, predictor

from base_sglang.core import SelectionConfig
from base_sglang.core.routing import fold_router, route_select
from base_sglang.kernels import route_select_experts


def folded_scores(T, E, H, *, seed=0, dtype=torch.bfloat16, ties=False):
    """(scores [T, 2E] in dtype from one GEMM, predictor) for a random router and predictor."""
    g = torch.Generator().manual_seed(seed)
    pred = predictor(E, H, seed=seed)
    router = torch.randn(E, H, generator=g) * 0.5
    z = torch.randn(T, H, generator=g)
    w2 = fold_router(router.to(DEVICE, dtype), pred, 0)  # [2E, H]
    scores = z.to(DEVICE, dtype) @ w2.T  # [T, 2E]
    if ties:  # logits on a coarse grid: many exact ties, +0.0 and -0.0 among them
        coarse = (torch.randint(-3, 4, (T, E), generator=g) * 0.5).to(DEVICE, dtype)
        coarse[0, :8] = torch.tensor([0.0, -0.0] * 4)
        scores[:, :E] = coarse
    return scores, pred


def check_route(T, E, K, budget, *, policy="base_plus", norm=True, renorm="native", backfill=True,
                H=32, seed=0, dtype=torch.bfloat16, ties=False, table=None):
    scores, pred = folded_scores(T, E, H, seed=seed, dtype=dtype, ties=ties)
    logits, yhat = scores[:, :E], scores[:, E:]  # strided views of one GEMM output
    if table is not None:
        pred.layer_budget = torch.as_tensor(table, dtype=torch.float32)[None].to(DEVICE)
    cfg = SelectionConfig(policy=policy, renorm=renorm, backfill=backfill)
    b = torch.as_tensor(budget).to(DEVICE)
    want, ids, w = route_select(logits, yhat, b, 0, cfg, pred, top_k=K, norm_topk_prob=norm)
    got = route_select_experts(logits, yhat, b, 0, cfg, pred, top_k=K, norm_topk_prob=norm)
    assert got.ids.dtype == torch.int32 and got.weights.dtype == torch.float32
    assert torch.equal(got.ids.long(), want.ids), (got.ids, want.ids)
    torch.testing.assert_close(got.weights, want.weights.float(), rtol=0, atol=W_ATOL[torch.float32])
    assert int(got.stats.num_union) == int(want.stats.num_union)
    assert int(got.stats.num_kept) == int(want.stats.num_kept)
    torch.testing.assert_close(got.stats.removed_cost, want.stats.removed_cost, rtol=1e-5, atol=1e-6)
    return got, want, ids, w

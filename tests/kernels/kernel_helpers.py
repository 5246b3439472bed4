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


W_ATOL = {torch.float32: 1e-6, torch.bfloat16: 2.0 ** -8}  # fp32 rounding / one bf16 ulp below 1


def compare_with_core(T, E, K, budget, *, policy="base", renorm="native", alpha=0.5, seed=0, norm=True,
                      id_dtype=torch.int64, w_dtype=torch.float32, backfill=True, one_expert=False,
                      H=24, table=None, bounds=None):
    """base_select_experts == the core's select_experts on one random routing: ids exact, weights to
    float rounding, the same statistics, rows the selection left alone keep their weights bit-exactly.
    Returns (the kernel's Selection, (logits, ids, weights))."""
    from base_sglang.core import SelectionConfig, select_experts
    from base_sglang.kernels import base_select_experts

    logits, ids, w = routing(T, E, K, seed=seed, norm=norm, id_dtype=id_dtype, one_expert=one_expert)
    w = w.to(w_dtype)
    hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(seed + 1)).bfloat16()
    pred = predictor(E, H, seed=seed)
    if table is not None:  # [E+1] per-layer schedule of layer 0 (policy base_sched), or [R, E+1]
        table = torch.as_tensor(table, dtype=torch.float32)  # one per batch-size range (bounds)
        pred.layer_budget = (table[None] if bounds is None else table[:, None]).to(DEVICE)
        if bounds is not None:
            pred.layer_budget_max_batch = torch.as_tensor(bounds, dtype=torch.float32)
    cfg = SelectionConfig(policy=policy, renorm=renorm, renorm_alpha=alpha, backfill=backfill)
    b = torch.as_tensor(budget).to(DEVICE)
    args = (logits, ids, w, hidden.to(DEVICE), b, 0, cfg, pred)
    want = select_experts(*args, norm_topk_prob=norm)
    got = base_select_experts(*args, norm_topk_prob=norm)
    assert got.ids.dtype == ids.dtype and got.weights.dtype == w.dtype
    assert torch.equal(got.ids, want.ids), (got.ids, want.ids)
    torch.testing.assert_close(got.weights.float(), want.weights.float(), rtol=0,
                               atol=W_ATOL[w_dtype])
    assert int(got.stats.num_union) == int(want.stats.num_union)
    assert int(got.stats.num_kept) == int(want.stats.num_kept)
    torch.testing.assert_close(got.stats.removed_cost, want.stats.removed_cost, rtol=1e-5, atol=1e-6)
    unchanged = (got.ids == ids).all(1) & (b >= 0)  # [T] rows the selection left alone
    assert torch.equal(got.weights[unchanged], w[unchanged])
    return got, (logits, ids, w)

"""The router's softmax top-k and BASE's selection in ONE launch, from a folded router GEMM.

The predictor of BASE is linear in the MoE input z, like the router, so one GEMM computes both:
    scores = z @ [W_router; A]^T      [T, 2E]: router logits (columns 0..E-1) and a.z (E..2E-1)
(the predictor's rows stacked under the router's: `fold_router`). This kernel takes those columns
(any float dtype, row stride free) and the predictor bias b [E], and replaces the router's top-k:
    routing  p = softmax(logits); the top-K by logit (ties -> lower id); w = p, or p / sum of the
             top-K p when the model renormalises (norm_topk_prob)
    scores   c[t, e] = w[t, e]^2 exp(2 (a.z + b)[t, e]) on routed pairs; D = sum over real rows
             (fixed order: deterministic); union = experts routed by a real row
    budget   M = clamp(max budget of the real rows, 0, E) (-1 = padded row, >= E dense), mapped
             through the layer's schedule row when one is given (base_sched)
    kept     S = the M union experts with the largest D (ties -> lower id): one sort of packed keys
    rows     backfill: the top-K experts of S by logit. A token's routed experts precede every
             other expert in its preference order, so this is exactly "its routed experts in S in
             their order, then the other experts of S by logit" (base_select's rule); drop only:
             routed experts outside S become -1 in place;
             weights as base_select (combine "always" / "never" / "partial"), a row whose ids did
             not change keeps its routed weights bit-exactly; padded rows: ids -1, weights 0.
Every program recomputes D from all T rows (a few exps per element of a [T, E] tile) and then
builds its own BLOCK_T rows: no grid barrier, no atomics, no second launch. SELECT=False is the
router's top-k alone (the dense routing), the baseline this launch replaces.
The oracle is base_sglang.core.select_experts fed the same top-k and log_norms (core.routing).
Shape legend: T tokens, K slots, E experts, BT rows per block, KK = next_pow2(K).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from base_sglang.kernels.base_fused import ID_BITS, SENTINEL, _packed, _unpack
from base_sglang.kernels.base_select import COMBINE_MODES, check_combine, check_table, layer_budget
from base_sglang.kernels.utils import (
    FLOAT_DTYPES,
    ID_DTYPES,
    check,
    check_tensor,
    launch_kwargs,
    use_pdl,
)


@triton.jit
def _route_rows(logits_ptr, stride_l, ts, tmask, es, emask, kk, K: tl.constexpr,
                BLOCK_KK: tl.constexpr, RENORM: tl.constexpr, ID_BITS: tl.constexpr,
                SENTINEL: tl.constexpr):
    """Rows ts of the router: (logits [BT, BE], keys, top keys [BT, KK], K-th key [BT], max,
    softmax denominator, routed mask [BT, BE], sum of routed p [BT])."""
    valid = tmask[:, None] & emask[None, :]
    lg = tl.load(logits_ptr + ts.to(tl.int64)[:, None] * stride_l + es[None, :], mask=valid,
                 other=float("-inf")).to(tl.float32)  # [BT, BE]
    lg = tl.where(tmask[:, None], lg, 0.0)  # rows past T: finite, never stored
    key = tl.where(valid, _packed(lg, es[None, :], ID_BITS), SENTINEL)  # [BT, BE] distinct per row
    top = tl.topk(key, BLOCK_KK)  # [BT, KK] descending
    kth = tl.sum(tl.where(kk[None, :] == K - 1, top, 0), axis=1)  # [BT] the K-th largest key
    routed = valid & (key >= kth[:, None])  # [BT, BE] the token's top-K
    mx = tl.max(lg, axis=1)  # [BT]
    ex = tl.where(emask[None, :], tl.exp(lg - mx[:, None]), 0.0)
    s = tl.sum(ex, axis=1)  # [BT]
    p = ex / s[:, None]  # [BT, BE]
    tp = tl.maximum(tl.sum(tl.where(routed, p, 0.0), axis=1), 1e-30)  # [BT] routed mass
    return lg, key, top, kth, mx, s, routed, p, tp


@triton.jit
def _base_route_kernel(
    logits_ptr, yhat_ptr, b_ptr, budget_ptr, table_ptr,
    out_ids_ptr, out_w_ptr, counts_ptr, removed_ptr,
    T, stride_l, stride_y, alpha,
    E: tl.constexpr, K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_KK: tl.constexpr,
    BLOCK_T: tl.constexpr, T_CHUNKS: tl.constexpr, BLOCK_B: tl.constexpr,
    SELECT: tl.constexpr, RENORM: tl.constexpr, BACKFILL: tl.constexpr, COMBINE: tl.constexpr,
    HAS_TABLE: tl.constexpr, USE_PDL: tl.constexpr,
    ID_BITS: tl.constexpr, SENTINEL: tl.constexpr,
):
    pid = tl.program_id(0)
    es = tl.arange(0, BLOCK_E)  # [BE]
    emask = es < E
    kk = tl.arange(0, BLOCK_KK)  # [KK] slots (also output slots j)
    kmask = kk < K
    if SELECT:
        b_e = tl.load(b_ptr + es, mask=emask, other=0.0).to(tl.float32)  # static: before the wait
    if USE_PDL:  # wait for the producer (the router GEMM), then let the next launch start early
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()

    d = tl.zeros([BLOCK_E], dtype=tl.float32)
    m = 0
    if SELECT:
        # ---- batch budget and batch score D over every row (each program: no barrier) ----------
        vmax = tl.zeros([BLOCK_B], dtype=tl.int64)
        for b0 in range(0, T, BLOCK_B):
            bs = b0 + tl.arange(0, BLOCK_B)
            vmax = tl.maximum(vmax, tl.load(budget_ptr + bs, mask=bs < T, other=-1).to(tl.int64))
        m = tl.minimum(tl.maximum(tl.max(vmax, axis=0), 0), E)
        if HAS_TABLE:
            m = layer_budget(m, table_ptr, E)
        cnt = tl.zeros([BLOCK_E], dtype=tl.int32)
        for c in tl.static_range(T_CHUNKS):  # independent chunks: their loads can overlap
            ts = c * BLOCK_T + tl.arange(0, BLOCK_T)
            tmask = ts < T
            real = tl.load(budget_ptr + ts, mask=tmask, other=-1) >= 0  # [BT]
            _lg, _key, _top, _kth, _mx, _s, routed, p, tp = _route_rows(
                logits_ptr, stride_l, ts, tmask, es, emask, kk, K, BLOCK_KK, RENORM, ID_BITS,
                SENTINEL)
            routed = routed & real[:, None]
            w = p  # [BT, BE] the routed weights (where routed)
            if RENORM:
                w = p / tp[:, None]
            yh = tl.load(yhat_ptr + ts.to(tl.int64)[:, None] * stride_y + es[None, :],
                         mask=routed, other=0.0).to(tl.float32) + b_e[None, :]
            cost = w * w * tl.exp(2.0 * yh)
            cost = tl.where(routed & (cost == cost), cost, 0.0)  # a NaN row scores nothing
            d += tl.sum(cost, axis=0)
            cnt += tl.sum(routed.to(tl.int32), axis=0)
        in_union = (cnt > 0) & emask
        dkey = tl.where(in_union, _packed(d, es, ID_BITS), -1)  # [BE]
        ranked = tl.sort(dkey, descending=True)
        kth_d = tl.sum(tl.where(es == m - 1, ranked, 0), axis=0)  # [] the M-th largest key
        in_s = in_union & (dkey >= kth_d) & (m > 0)  # [BE] the kept set S
        if pid == 0:
            tl.store(counts_ptr, tl.sum(in_union.to(tl.int64), axis=0))
            tl.store(counts_ptr + 1, tl.sum(in_s.to(tl.int64), axis=0))
            tl.store(removed_ptr, tl.sum(tl.where(in_union & (in_s == 0), d, 0.0), axis=0))

    # ---- this program's rows -------------------------------------------------------------------
    ts = pid * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    tmask = ts < T
    m2 = tmask[:, None] & kmask[None, :]
    real = tl.load(budget_ptr + ts, mask=tmask, other=-1) >= 0  # [BT]
    _lg, key, top, kth, mx, s, routed, _p, tp = _route_rows(
        logits_ptr, stride_l, ts, tmask, es, emask, kk, K, BLOCK_KK, RENORM, ID_BITS, SENTINEL)
    ids_t, l_own = _unpack(top, ID_BITS)  # [BT, KK] the router's top-K, best first
    p_k = tl.where(m2, tl.exp(l_own - mx[:, None]) / s[:, None], 0.0)  # [BT, KK]
    w_t = p_k  # [BT, KK] the model's weights
    if RENORM:
        w_t = p_k / tp[:, None]
    if SELECT:
        if BACKFILL:  # the top-K of S by logit: routed experts in S first, then backfill
            nkey = tl.topk(tl.where(in_s[None, :], key, SENTINEL), BLOCK_KK)  # [BT, KK]
            new, l_new = _unpack(nkey, ID_BITS)
            ok = (nkey > SENTINEL) & m2
            new = tl.where(ok, new, -1)
            p_new = tl.where(ok, tl.exp(l_new - mx[:, None]) / s[:, None], 0.0)
            is_own = ok & (nkey >= kth[:, None])
            w_own = p_new  # own slots: their routed weight, as w_t computes it
            if RENORM:
                w_own = p_new / tp[:, None]
        else:  # drop only: routed experts outside S become -1 in their slots
            hit = (ids_t[:, :, None] == es[None, None, :]) & in_s[None, None, :]  # [BT, KK, BE]
            ok = (tl.max(hit.to(tl.int32), axis=2) > 0) & m2
            new = tl.where(ok, ids_t, -1)
            p_new = tl.where(ok, p_k, 0.0)
            is_own = ok
            w_own = w_t
        total_w = tl.sum(tl.where(m2, w_t, 0.0), axis=1)  # [BT]
        if COMBINE == 0:  # "always"
            p_sum = tl.sum(p_new, axis=1)
            new_w = p_new / tl.maximum(p_sum, 1e-30)[:, None] * total_w[:, None]
        else:  # "never", then "partial" rescales by (W / sum) ** alpha
            total_p = tl.sum(p_k, axis=1)
            new_w = tl.where(is_own, w_own,
                             p_new * (total_w / tl.maximum(total_p, 1e-30))[:, None])
            if COMBINE == 2:
                total_new = tl.maximum(tl.sum(tl.where(ok, new_w, 0.0), axis=1), 1e-30)
                ratio = tl.maximum(total_w / total_new, 0.0)  # [BT]
                safe = tl.where(ratio > 0.0, ratio, 1.0)
                scale = tl.where(ratio > 0.0, tl.exp(alpha * tl.log(safe)),
                                 tl.where(alpha == 0.0, 1.0, 0.0))
                new_w = new_w * scale[:, None]
        unchanged = tl.sum(((new != ids_t) & m2).to(tl.int32), axis=1) == 0  # [BT]
        new_w = tl.where(unchanged[:, None], w_t, new_w)
    else:
        new = ids_t
        new_w = w_t
        ok = m2
    keep = ok & real[:, None]
    new = tl.where(keep, new, -1)
    new_w = tl.where(keep, new_w, 0.0)
    offs = ts[:, None] * K + kk[None, :]
    tl.store(out_ids_ptr + offs, new.to(out_ids_ptr.dtype.element_ty), mask=m2)
    tl.store(out_w_ptr + offs, new_w.to(out_w_ptr.dtype.element_ty), mask=m2)


def route_blocks(T: int, E: int, K: int) -> dict:
    """Tile sizes and warps of the route-select launch for (T, E, K)."""
    block_e = triton.next_power_of_2(E)
    block_t = max(1, min(16, triton.next_power_of_2(max(T, 1)), 2048 // block_e))
    return dict(BLOCK_E=block_e, BLOCK_KK=triton.next_power_of_2(K), BLOCK_T=block_t,
                T_CHUNKS=triton.next_power_of_2(triton.cdiv(max(T, 1), block_t)),
                BLOCK_B=min(1024, triton.next_power_of_2(max(T, 1))),
                num_warps=4 if block_t * block_e <= 1024 else 8)


def base_route_select(
    logits: torch.Tensor,  # [T, E] float, unit column stride (the folded GEMM's first E columns)
    yhat: torch.Tensor | None,  # [T, E] float a.z, unit column stride (its next E columns); None: top-k only
    b: torch.Tensor | None,  # [E] float predictor bias of this layer
    budget: torch.Tensor,  # [T] int32/int64 contiguous on the device; -1 = padded row, >= E dense
    *,
    top_k: int,
    renormalize: bool,  # the model's norm_topk_prob
    backfill: bool = True,
    combine: str = "always",  # "always" | "never" | "partial" (SelectionConfig.combine_mode)
    alpha: float = 0.5,
    table: torch.Tensor | None = None,  # [E+1] fp32 this layer's schedule (base_sched), or None
    ids_dtype: torch.dtype = torch.int32,
):
    """Top-k routing + BASE in one launch. Returns (ids [T, K] ids_dtype, -1 dropped; weights
    [T, K] fp32, 0 dropped; counts [2] int64 (union, kept); removed [1] fp32). With yhat None it is
    the router's top-k alone (counts and removed are then left unwritten).

    Contract: T rows of finite logits; K <= E. No host sync; graph-capturable (budgets are read on
    the device). T_CHUNKS is a power of two of T / BLOCK_T, so eager calls compile a few variants.
    """
    T, E = logits.shape
    dev = logits.device
    K = int(top_k)
    check(logits.dtype in FLOAT_DTYPES and logits.stride(1) == 1,
          f"logits: needs a float dtype and unit column stride, got {logits.dtype} {logits.stride()}")
    check(1 <= K <= E and E < (1 << ID_BITS), f"top_k: must be in [1, E={E}], got {K}")
    check(ids_dtype in ID_DTYPES, f"ids_dtype: expected one of {ID_DTYPES}, got {ids_dtype}")
    check_tensor("budget", budget, (T,), ID_DTYPES, dev)
    select = yhat is not None
    if select:
        check(yhat.dim() == 2 and tuple(yhat.shape) == (T, E) and yhat.dtype in FLOAT_DTYPES
              and yhat.stride(1) == 1 and yhat.device == dev,
              f"yhat: expected [{T}, {E}] float with unit column stride on {dev}, got "
              f"{tuple(yhat.shape)} {yhat.dtype} {yhat.stride()} on {yhat.device}")
        check(b is not None, "b: the predictor bias is required with yhat")
        check_tensor("b", b, (E,), FLOAT_DTYPES, dev)
        check_combine(combine, alpha)
        check_table(table, E, dev)
    out_ids = torch.empty(T, K, dtype=ids_dtype, device=dev)
    out_w = torch.empty(T, K, dtype=torch.float32, device=dev)
    counts = torch.empty(2, dtype=torch.int64, device=dev)
    removed = torch.empty(1, dtype=torch.float32, device=dev)
    if T == 0:
        return out_ids, out_w, counts.zero_(), removed.zero_()
    cfg = route_blocks(T, E, K)
    num_warps = cfg.pop("num_warps")
    pdl = use_pdl(dev)
    grid = (triton.cdiv(T, cfg["BLOCK_T"]),)
    _base_route_kernel[grid](
        logits, yhat if select else logits, b if select else logits, budget,
        table if table is not None else logits, out_ids, out_w, counts, removed,
        T, logits.stride(0), yhat.stride(0) if select else 0, float(alpha),
        E=E, K=K, **cfg, SELECT=select, RENORM=bool(renormalize), BACKFILL=backfill,
        COMBINE=COMBINE_MODES[combine], HAS_TABLE=table is not None, USE_PDL=pdl,
        ID_BITS=ID_BITS, SENTINEL=SENTINEL, num_warps=num_warps, **launch_kwargs(pdl))
    return out_ids, out_w, counts, removed

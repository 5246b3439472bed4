"""BASE selection: batch score, batch budget, top-M kept set, backfill and combine weights, one launch.

Every program (one per token row) first recomputes the batch-level quantities from device tensors,
so no grid-wide sync, atomics or host round trip is needed:
    M      = clamp(max budget over real rows, 0, E)          (>= E anywhere -> dense; -1 = padded row)
    D[e]   = sum of cost over real pairs routed to e           (fixed-order one-hot sum: deterministic)
    rank   = stable descending rank of D among the union       (ties -> lower expert id)
    in_s   = union & rank < M                                  (the kept set S, |S| <= M)
then builds its own row:
    backfill: its routed experts that are in S (in slot order), then the experts of S it did not route,
              in descending router-logit order (ties -> lower id), up to K; -1 pads the rest;
    drop:     its routed experts that are in S keep their slot, the others become -1;
    weights:  renormalised over the final set to the token's original total weight W ("always"),
              the model's own weight for routed experts and p * (W / sum p_routed) for backfilled
              ones ("never"), or those "never" weights times (W / their sum) ** alpha ("partial",
              base_plus); a row whose ids did not change keeps its weights bit-exactly.
Program 0 also writes D, the kept mask and the statistics. This is base_sglang.core.selection
(policies "base" and "base_plus") on the GPU; its outputs match the core exactly for ids and to
float rounding for weights. Shape legend: T tokens, K slots, E experts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from base_sglang.kernels.utils import (
    FLOAT_DTYPES,
    ID_DTYPES,
    check,
    check_tensor,
    launch_kwargs,
    use_pdl,
)

COMBINE_MODES = {"always": 0, "never": 1, "partial": 2}  # kernel constexpr COMBINE


@triton.jit
def layer_budget(m, table_ptr, E: tl.constexpr):
    """This layer's budget under a per-layer schedule (policy base_sched): round(table[m]) for a
    batch budget m < E, m itself from E on (dense stays dense); table [E+1] fp32 of integer values."""
    idx = tl.minimum(tl.maximum(m, 0), E)
    m_l = tl.load(table_ptr + idx).to(tl.float32)
    m_l = tl.minimum(tl.maximum(tl.floor(m_l + 0.5), 0.0), E * 1.0).to(tl.int64)
    return tl.where(m >= E, m, m_l)


@triton.jit
def batch_budget(budget_ptr, T, table_ptr, E: tl.constexpr, BLOCK_B: tl.constexpr,
                 HAS_TABLE: tl.constexpr):
    """The batch budget M: the largest budget of the T rows clamped to [0, E] (-1 = padded row,
    >= E dense), then this layer's share of the schedule when a table is given (base_sched)."""
    vmax = tl.zeros([BLOCK_B], dtype=tl.int64)
    for b0 in range(0, T, BLOCK_B):
        bs = b0 + tl.arange(0, BLOCK_B)
        vmax = tl.maximum(vmax, tl.load(budget_ptr + bs, mask=bs < T, other=-1).to(tl.int64))
    m = tl.minimum(tl.maximum(tl.max(vmax, axis=0), 0), E)
    if HAS_TABLE:
        m = layer_budget(m, table_ptr, E)
    return m


@triton.jit
def _base_select_kernel(
    cost_ptr, ids_ptr, w_ptr, logits_ptr, budget_ptr, table_ptr,
    out_ids_ptr, out_w_ptr, d_ptr, in_s_ptr, counts_ptr, removed_ptr,
    T, stride_lt, alpha,
    E: tl.constexpr, K: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr,
    BACKFILL: tl.constexpr, COMBINE: tl.constexpr, HAS_TABLE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:  # wait for the producer kernel, then let the next launch start early
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0)
    es = tl.arange(0, BLOCK_E)  # [BE] expert ids
    emask = es < E

    # this token's row, loaded first so the loads overlap the batch-level work below
    ks = tl.arange(0, BLOCK_K)  # [BK] slot ids (also output slot ids j)
    kmask = ks < K
    e_k = tl.load(ids_ptr + t * K + ks, mask=kmask, other=-1).to(tl.int32)  # [BK]
    w_k = tl.load(w_ptr + t * K + ks, mask=kmask, other=0.0).to(tl.float32)  # [BK]
    real_t = tl.load(budget_ptr + t + ks * 0) >= 0  # [BK] (vector: see base_score)
    logit = tl.load(logits_ptr + t * stride_lt + es, mask=emask, other=float("-inf")).to(tl.float32)

    m = batch_budget(budget_ptr, T, table_ptr, E, BLOCK_T, HAS_TABLE)  # [] batch budget M

    # ---- batch score D and union counts (one-hot sums in a fixed order) -------------------------
    d = tl.zeros([BLOCK_E], dtype=tl.float32)
    cnt = tl.zeros([BLOCK_E], dtype=tl.int32)
    num_pairs = T * K
    for p0 in range(0, num_pairs, BLOCK_P):
        ps = p0 + tl.arange(0, BLOCK_P)  # [BP] flat (token, slot) pairs
        pmask = ps < num_pairs
        e_p = tl.load(ids_ptr + ps, mask=pmask, other=-1).to(tl.int32)
        real_p = tl.load(budget_ptr + ps // K, mask=pmask, other=-1) >= 0
        c_p = tl.load(cost_ptr + ps, mask=pmask, other=0.0)
        oh = (e_p[:, None] == es[None, :]) & (real_p & pmask)[:, None]  # [BP, BE]
        d += tl.sum(tl.where(oh, c_p[:, None], 0.0), axis=0)
        cnt += tl.sum(oh.to(tl.int32), axis=0)
    in_union = (cnt > 0) & emask  # [BE]

    # ---- kept set: stable top-M of D over the union ---------------------------------------------
    s = tl.where(in_union, d, float("-inf"))  # [BE]
    beats = (s[None, :] > s[:, None]) | ((s[None, :] == s[:, None]) & (es[None, :] < es[:, None]))
    rank = tl.sum((beats & emask[None, :]).to(tl.int32), axis=1)  # [BE] experts ranked above e
    in_s = in_union & (rank < m)  # [BE]

    if t == 0:
        tl.store(d_ptr + es, d, mask=emask)
        tl.store(in_s_ptr + es, in_s.to(tl.int8), mask=emask)
        tl.store(counts_ptr, tl.sum(in_union.to(tl.int64), axis=0))
        tl.store(counts_ptr + 1, tl.sum(in_s.to(tl.int64), axis=0))
        tl.store(removed_ptr, tl.sum(tl.where(in_union & (in_s == 0), d, 0.0), axis=0))

    # ---- this token's row ----------------------------------------------------------------------
    hit = (e_k[:, None] == es[None, :]) & kmask[:, None]  # [BK, BE] own slot k routes expert e
    own_in = tl.sum((hit & in_s[None, :]).to(tl.int32), axis=1) > 0  # [BK] slot kept
    routed = tl.sum(hit.to(tl.int32), axis=0) > 0  # [BE] expert in own top-k

    ex = tl.where(emask, tl.exp(logit - tl.max(logit, axis=0)), 0.0)
    p = ex / tl.sum(ex, axis=0)  # [BE] router softmax
    p_k = tl.sum(tl.where(hit, p[None, :], 0.0), axis=1)  # [BK] p of own slots

    if BACKFILL:
        own_i = own_in.to(tl.int32)
        pos_k = tl.cumsum(own_i, axis=0) - own_i  # [BK] output slot of each kept own expert
        n_own = tl.sum(own_i, axis=0)
        cand = in_s & (routed == 0)  # [BE] kept experts the token did not route
        before = cand[None, :] & ((logit[None, :] > logit[:, None])
                                  | ((logit[None, :] == logit[:, None]) & (es[None, :] < es[:, None])))
        slot_e = n_own + tl.sum(before.to(tl.int32), axis=1)  # [BE] output slot of candidate e
        take = cand & (slot_e < K)
        own_to_j = own_in[None, :] & (pos_k[None, :] == ks[:, None])  # [BK(j), BK(k)]
        rest_to_j = take[None, :] & (slot_e[None, :] == ks[:, None])  # [BK(j), BE]
        new = (tl.sum(tl.where(own_to_j, e_k[None, :] + 1, 0), axis=1)
               + tl.sum(tl.where(rest_to_j, es[None, :] + 1, 0), axis=1) - 1)  # [BK] -1 = empty
        p_new = (tl.sum(tl.where(own_to_j, p_k[None, :], 0.0), axis=1)
                 + tl.sum(tl.where(rest_to_j, p[None, :], 0.0), axis=1))
        w_own = tl.sum(tl.where(own_to_j, w_k[None, :], 0.0), axis=1)
        is_own = tl.sum(own_to_j.to(tl.int32), axis=1) > 0
    else:
        new = tl.where(own_in, e_k, -1)
        p_new = tl.where(own_in, p_k, 0.0)
        w_own = w_k
        is_own = own_in

    ok = (new >= 0) & kmask
    total_w = tl.sum(w_k, axis=0)
    if COMBINE == 0:  # "always"
        p_sum = tl.sum(tl.where(ok, p_new, 0.0), axis=0)
        new_w = p_new / tl.maximum(p_sum, 1e-30) * total_w
    else:  # "never", then "partial" rescales by (W / sum) ** alpha
        total_p = tl.sum(p_k, axis=0)
        new_w = tl.where(is_own, w_own, p_new * (total_w / tl.maximum(total_p, 1e-30)))
        if COMBINE == 2:
            total_new = tl.maximum(tl.sum(tl.where(ok, new_w, 0.0), axis=0), 1e-30)
            ratio = tl.maximum(total_w / total_new, 0.0)
            # ratio ** alpha as exp(alpha log ratio); 0 ** alpha = 1 for alpha 0, else 0 (as torch.pow)
            safe = tl.where(ratio > 0.0, ratio, 1.0)
            scale = tl.where(ratio > 0.0, tl.exp(alpha * tl.log(safe)),
                             tl.where(alpha == 0.0, 1.0, 0.0))
            new_w = new_w * scale
    unchanged = tl.sum(((new != e_k) & kmask).to(tl.int32), axis=0) == 0
    new_w = tl.where(unchanged, w_k, new_w)
    keep = ok & real_t
    new = tl.where(keep, new, -1)
    new_w = tl.where(keep, new_w, 0.0)
    tl.store(out_ids_ptr + t * K + ks, new.to(out_ids_ptr.dtype.element_ty), mask=kmask)
    tl.store(out_w_ptr + t * K + ks, new_w.to(out_w_ptr.dtype.element_ty), mask=kmask)


def check_combine(combine: str, alpha: float) -> None:
    check(combine in COMBINE_MODES,
          f"combine: must be one of {tuple(COMBINE_MODES)}, got {combine!r}")
    check(0.0 <= alpha <= 1.0, f"alpha: must be in [0, 1], got {alpha}")


def check_table(table: torch.Tensor | None, E: int, device: torch.device) -> None:
    if table is not None:
        check_tensor("table", table, (E + 1,), (torch.float32,), device)


def selection_outputs(ids: torch.Tensor, weights: torch.Tensor, E: int) -> tuple:
    """(ids [T, K], weights [T, K], d [E] fp32, in_s [E] int8, counts [2] int64, removed [1] fp32),
    uninitialised: the selection kernels write every element (no memset launches per call)."""
    dev = ids.device
    return (torch.empty_like(ids), torch.empty_like(weights),
            torch.empty(E, dtype=torch.float32, device=dev),
            torch.empty(E, dtype=torch.int8, device=dev),
            torch.empty(2, dtype=torch.int64, device=dev),
            torch.empty(1, dtype=torch.float32, device=dev))


def base_select(
    cost: torch.Tensor,  # [T, K] fp32 from base_score (0 on padded rows)
    ids: torch.Tensor,  # [T, K] int32/int64 contiguous, the router's top-k
    weights: torch.Tensor,  # [T, K] float contiguous, the model's combine weights
    logits: torch.Tensor,  # [T, E] float, unit column stride: router logits (preference order)
    budget: torch.Tensor,  # [T] int32/int64 contiguous on the device; -1 = padded row, >= E dense
    *,
    backfill: bool = True,
    combine: str = "always",  # "always" | "never" | "partial" (SelectionConfig.combine_mode)
    alpha: float = 0.5,  # exponent of "partial" (SelectionConfig.renorm_alpha), in [0, 1]
    table: torch.Tensor | None = None,  # [E+1] fp32 per-layer schedule (base_sched), or None
):
    """Apply BASE to one MoE layer's routing. Returns (ids, weights, d, in_s, counts, removed):
    ids [T, K] (ids dtype, -1 dropped), weights [T, K] (weights dtype, 0 dropped), d [E] fp32 batch
    score, in_s [E] int8 kept mask, counts [2] int64 (union size, kept size), removed [1] fp32.

    Contract: real rows route distinct ids in [0, E). No host sync; graph-capturable (the budgets
    are read from `budget` on the device at run time).
    """
    T, E = logits.shape
    K = ids.shape[1]
    dev = logits.device
    check(logits.dtype in FLOAT_DTYPES and logits.stride(1) == 1,
          f"logits: needs a float dtype and unit column stride, got {logits.dtype} {logits.stride()}")
    check_tensor("cost", cost, (T, K), (torch.float32,), dev)
    check_tensor("ids", ids, (T, K), ID_DTYPES, dev)
    check_tensor("weights", weights, (T, K), FLOAT_DTYPES, dev)
    check_tensor("budget", budget, (T,), ID_DTYPES, dev)
    check_combine(combine, alpha)
    new_ids, new_w, d, in_s, counts, removed = selection_outputs(ids, weights, E)
    if T == 0:
        return new_ids, new_w, d.zero_(), in_s.zero_(), counts.zero_(), removed.zero_()
    pdl = use_pdl(dev)
    block_e = triton.next_power_of_2(E)
    check_table(table, E, dev)
    _base_select_kernel[(T,)](
        cost, ids, weights, logits, budget, budget if table is None else table,
        new_ids, new_w, d, in_s, counts, removed,
        T, logits.stride(0), float(alpha), E=E, K=K, BLOCK_E=block_e,
        BLOCK_K=triton.next_power_of_2(K), BLOCK_P=max(16, min(128, 16384 // block_e)),
        BLOCK_T=min(triton.next_power_of_2(T), 256), BACKFILL=backfill,
        COMBINE=COMBINE_MODES[combine], HAS_TABLE=table is not None, USE_PDL=pdl,
        num_warps=8 if block_e >= 128 else 4,
        **launch_kwargs(pdl))
    return new_ids, new_w, d, in_s, counts, removed

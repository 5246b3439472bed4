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
             their order, then the other experts of S by logit" (base_select's rule). When
             |S| <= COMPACT (a runtime branch: budgets change between graph replays) the rows'
             logits at S's columns, the first |S| sorted keys, are reloaded into a [BT, COMPACT]
             tile and the top-K runs there (same keys, same result); else on the [BT, BE] tile
             masked to S. Drop only:
             routed experts outside S become -1 in place;
             weights as base_select (combine "always" / "never" / "partial"), a row whose ids did
             not change keeps its routed weights bit-exactly; padded rows: ids -1, weights 0.
Every program recomputes D from all T rows (a few exps per element of a [T, E] tile) and then
builds its own BLOCK_T rows: no grid barrier, no atomics, no second launch. When one block holds
every row and M >= the union, nothing can be dropped: the routing is returned as it is, without D.
SELECT=False is the router's top-k alone (the dense routing), the baseline this launch replaces.
The union is OR-reduced as 8-expert bit words (one word per thread across the rows, not 8 counts);
with one block M comes from the rows' budgets it already loaded. The two backfill paths leave the
[BT, KK] rows in different layouts, so combine_rows sums over slots in a fixed order (SLOT_R,
base_fused.slot_sum): both paths give the same weights bit for bit, and at the default tilings
(K 5-8) the order is the one the router's layout gave those sums before the narrow path, so the
weights are those of the previous kernel too (sm_90, Triton 3.6: compiled layouts and PTX checked).
The narrow tile's top-K is K max-reductions whatever ITER says (shorter there than tl.topk).
Keys: int32 (logit bits, id) for bf16 logits (KEY32), int64 otherwise; the top-k is a bitonic
tl.topk, or K max-reductions (ITER). D goes through a per-program scratch row before the top-M
sort (SCRATCH): read back with a fresh arange it has one key per thread, and the sort compiles to
~160 SASS instructions instead of ~1500 for the [BE] slice of a [BT, BE] tile (sm_90, Triton 3.6;
benchmarks/sass_count.py). At small T the launch is one program's dependent chain, so its time
follows that count (Nsight Compute, BENCHMARKS.md). Longest executed path at Qwen3 T = 16
(sass_count's path columns): 2887 SASS instructions before the sixth session, 2597 with the
narrow backfill off, 2124 through it (|S| <= 32), 2427 through its full-tile fallback.
The oracle is base_sglang.core.select_experts fed the same top-k and log_norms (core.routing).
Shape legend: T tokens, K slots, E experts, BT rows per block, KK = next_pow2(K).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from base_sglang.kernels.base_fused import (
    ID_BITS,
    SENTINEL,
    _packed,
    _unpack,
    combine_rows,
    store_rows,
)
from base_sglang.kernels.base_select import (
    COMBINE_MODES,
    batch_budget,
    check_combine,
    check_table,
    layer_budget,
)
from base_sglang.kernels.utils import (
    FLOAT_DTYPES,
    ID_DTYPES,
    check,
    check_tensor,
    launch_kwargs,
    use_pdl,
)


@triton.jit
def _key(lg, es, KEY32: tl.constexpr, ID_BITS: tl.constexpr):
    """Keys ordering like (logit descending, id ascending). KEY32: int32 keys of bf16-exact logits
    (their fp32 bits end in 16 zeros: the high half orders them), ids in the low 16 bits."""
    if KEY32:
        bits = (lg + 0.0).to(tl.int32, bitcast=True)  # + 0.0: -0.0 -> +0.0
        ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
        return (ordered >> 16) * 65536 + (65535 - es)
    else:
        return _packed(lg, es, ID_BITS)


@triton.jit
def _unkey(key, KEY32: tl.constexpr, ID_BITS: tl.constexpr):
    """(expert id int32, logit fp32) of a key made by _key."""
    if KEY32:
        e = 65535 - (key & 65535)
        hi = key >> 16
        ordered = hi * 65536 + tl.where(hi < 0, 65535, 0)  # the low half a negative had
        bits = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF)
        return e.to(tl.int32), bits.to(tl.float32, bitcast=True)
    else:
        return _unpack(key, ID_BITS)


@triton.jit
def _top(key, kk, K: tl.constexpr, BLOCK_KK: tl.constexpr, ITER: tl.constexpr, SENT: tl.constexpr):
    """(top-K keys of each row [BT, KK] descending, SENT past K; the K-th key [BT])."""
    if ITER:  # K max-reductions, each removing the row's best (keys are distinct per row)
        top = tl.zeros([key.shape[0], BLOCK_KK], dtype=key.dtype) + SENT
        cur = key
        for j in tl.static_range(K):
            kth = tl.max(cur, axis=1)  # [BT]
            top = tl.where(kk[None, :] == j, kth[:, None], top)
            cur = tl.where(cur == kth[:, None], SENT, cur)
    else:
        top = tl.topk(key, BLOCK_KK)  # [BT, KK] descending
        top = tl.where(kk[None, :] < K, top, SENT)
        kth = tl.min(tl.where(kk[None, :] < K, top, tl.max(top, axis=1)[:, None]), axis=1)
    return top, kth


@triton.jit
def _top_of_s(ranked, n_s, lg_ptr, stride, ts, tmask, kk, K: tl.constexpr, BLOCK_KK: tl.constexpr,
              COMPACT: tl.constexpr, KEY32: tl.constexpr, ID_BITS: tl.constexpr, SENT: tl.constexpr):
    """The top-K keys [BT, KK] of rows ts among S's experts, S being the first n_s <= COMPACT
    entries of ranked [BE] (the sorted (D, id) keys): the rows' logits at S's columns, reloaded
    (L1/L2) into a [BT, COMPACT] tile. The same keys as the [BT, BE] tile masked to S, so the
    same top-K, on a tile BE / COMPACT times narrower."""
    cs = tl.arange(0, COMPACT)  # [CW] positions in S
    first = tl.gather(ranked, cs, 0)  # [CW] the CW largest keys
    in_c = cs < n_s
    col = tl.where(in_c, ((1 << ID_BITS) - 1 - (first & ((1 << ID_BITS) - 1))).to(tl.int32), 0)
    lg_c, valid_c = _load_rows(lg_ptr, stride, ts, tmask, col, in_c)  # [BT, CW]
    key_c = tl.where(valid_c, _key(lg_c, col[None, :], KEY32, ID_BITS), SENT)
    top, _kth = _top(key_c, kk, K, BLOCK_KK, True, SENT)  # K max-reductions: on a tile this
    # narrow ~80 SASS shorter than the bitonic tl.topk (Qwen3 T = 16: 2207 -> 2124 on the path)
    return top


@triton.jit
def _route_rows(lg, valid, es, emask, kk, K: tl.constexpr, BLOCK_KK: tl.constexpr,
                KEY32: tl.constexpr, ITER: tl.constexpr, ID_BITS: tl.constexpr, SENT: tl.constexpr):
    """The router on loaded rows lg [BT, BE] (invalid entries any finite value): (keys, top keys
    [BT, KK], K-th key [BT], max, softmax denominator, routed [BT, BE], p [BT, BE], routed mass)."""
    key = tl.where(valid, _key(lg, es[None, :], KEY32, ID_BITS), SENT)  # [BT, BE] distinct per row
    top, kth = _top(key, kk, K, BLOCK_KK, ITER, SENT)
    routed = valid & (key >= kth[:, None])  # [BT, BE] the token's top-K
    mx = tl.max(tl.where(valid, lg, float("-inf")), axis=1)  # [BT]
    mx = tl.where(mx > float("-inf"), mx, 0.0)  # rows past T: finite
    ex = tl.where(valid, tl.exp(lg - mx[:, None]), 0.0)
    s = tl.maximum(tl.sum(ex, axis=1), 1e-30)  # [BT]
    p = ex / s[:, None]  # [BT, BE]
    tp = tl.maximum(tl.sum(tl.where(routed, p, 0.0), axis=1), 1e-30)  # [BT] routed mass
    return key, top, kth, mx, s, routed, p, tp


@triton.jit
def _rows_budget(bud, table_ptr, E: tl.constexpr, HAS_TABLE: tl.constexpr):
    """batch_budget's M from the budgets bud [BT] of every row, already loaded (-1 past T): each
    clamped to [0, E] before the max (the same M, an int32 reduction), then the schedule."""
    m = tl.max(tl.minimum(tl.maximum(bud, 0), E).to(tl.int32), axis=0)
    if HAS_TABLE:
        m = layer_budget(m, table_ptr, E)
    return m


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _union_bits(rr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, G: tl.constexpr):
    """The experts routed by some row of rr [BT, BE] as G-bit words [BE / G]: bit j of word g is
    expert g * G + j. Packing first makes the cross-row reduction one word per thread instead of
    G counts (the rows' tile holds G adjacent experts per thread)."""
    sh = tl.arange(0, G)
    words = tl.sum(tl.reshape(rr.to(tl.int32), [BLOCK_T, BLOCK_E // G, G]) << sh[None, None, :], axis=2)
    return tl.reduce(words, 0, _or)  # [BE / G]


@triton.jit
def _union_of(bits, es, BLOCK_E: tl.constexpr, G: tl.constexpr):
    """[BE] bool: expert es in the union, from _union_bits' words."""
    return ((tl.reshape(tl.broadcast_to(bits[:, None], [BLOCK_E // G, G]), [BLOCK_E]) >> (es % G)) & 1) > 0


@triton.jit
def _load_rows(ptr, stride, ts, tmask, es, emask):
    valid = tmask[:, None] & emask[None, :]
    x = tl.load(ptr + ts.to(tl.int64)[:, None] * stride + es[None, :], mask=valid, other=0.0)
    return x.to(tl.float32), valid


@triton.jit
def _chunk_score(lg, yh, valid, real, b_e, es, emask, kk, K: tl.constexpr, BLOCK_KK: tl.constexpr,
                 RENORM: tl.constexpr, KEY32: tl.constexpr, ITER: tl.constexpr,
                 ID_BITS: tl.constexpr, SENT: tl.constexpr, BLOCK_T: tl.constexpr,
                 BLOCK_E: tl.constexpr, G: tl.constexpr):
    """(D [BE], _union_bits words [BE / G]) of loaded rows."""
    _key_, _top_, _kth, _mx, _s, routed, p, tp = _route_rows(lg, valid, es, emask, kk, K, BLOCK_KK,
                                                             KEY32, ITER, ID_BITS, SENT)
    routed = routed & real[:, None]
    w = p  # [BT, BE] the routed weights (where routed)
    if RENORM:
        w = p / tp[:, None]
    cost = w * w * tl.exp(2.0 * (yh + b_e[None, :]))
    cost = tl.where(routed & (cost == cost), cost, 0.0)  # a NaN row scores nothing
    return tl.sum(cost, axis=0), _union_bits(routed, BLOCK_T, BLOCK_E, G)


@triton.jit
def _kept_rows(d, in_union, n_union, m, key, kth, ids_t, w_t, p_k, mx, s, tp, m2, es, emask, kk, pid,
               lg_ptr, stride_l, ts, tmask, counts_ptr, removed_ptr, ws_ptr, alpha,
               BLOCK_E: tl.constexpr, K: tl.constexpr,
               BLOCK_KK: tl.constexpr, RENORM: tl.constexpr, BACKFILL: tl.constexpr, COMBINE: tl.constexpr,
               KEY32: tl.constexpr, ITER: tl.constexpr, SCRATCH: tl.constexpr,
               COMPACT: tl.constexpr, SLOT_R: tl.constexpr, ID_BITS: tl.constexpr, SENT: tl.constexpr):
    """From D [BE], the union [BE] and its size: S, the statistics (program 0) and this
    program's rows (ids [BT, KK], weights, mask of filled slots)."""
    if SCRATCH:  # D through this program's scratch row, read back in a one-per-thread layout:
        # Triton's sort of the [BE] slice of a [BT, BE] tile costs ~1500 instructions, of a
        # freshly loaded [BE] vector ~200 (SASS counts, sm_90)
        e1 = tl.arange(0, BLOCK_E)
        tl.store(ws_ptr + pid * BLOCK_E + es, tl.where(in_union, d, -1.0))
        tl.debug_barrier()
        d = tl.load(ws_ptr + pid * BLOCK_E + e1)  # [BE] -1 outside the union
        es = e1
        in_union = d >= 0.0  # (experts past E stored -1 too)
    dkey = tl.where(in_union, _packed(d, es, ID_BITS), -1)  # [BE] int64 keys (D, id)
    ranked = tl.sort(dkey, descending=True)
    at_m = tl.zeros([1], dtype=tl.int32) + tl.maximum(m - 1, 0).to(tl.int32)
    kth_d = tl.gather(ranked, at_m, 0)  # [1] the M-th largest key (a gather, not a [BE] reduction)
    in_s = in_union & (dkey >= kth_d) & (es * 0 + m > 0)  # [BE] the kept set S (a [BE] compare:
    # the interpreter types `bool tensor & scalar` by the tensor's source, here a float load)
    if pid == 0:  # |S| = min(M, |union|): one reduction fewer on the chain
        tl.store(counts_ptr, n_union.to(tl.int64))
        tl.store(counts_ptr + 1, tl.minimum(m, n_union).to(tl.int64))
        tl.store(removed_ptr, tl.sum(tl.where(in_union & (in_s == 0), d, 0.0), axis=0))
    # ---- this program's rows -----------------------------------------------------------------
    if BACKFILL:  # the top-K of S by logit: routed experts in S first, then backfill
        n_s = tl.minimum(m, n_union)  # |S|
        if COMPACT > 0:  # a runtime branch, both sides compiled: budgets change between replays
            if n_s <= COMPACT:  # S's columns alone
                nkey = _top_of_s(ranked, n_s, lg_ptr, stride_l, ts, tmask, kk, K, BLOCK_KK, COMPACT,
                                 KEY32, ID_BITS, SENT)
            else:  # the [BT, BE] tile masked to S
                nkey, _nk = _top(tl.where(in_s[None, :], key, SENT), kk, K, BLOCK_KK, ITER, SENT)
        else:
            nkey, _nk = _top(tl.where(in_s[None, :], key, SENT), kk, K, BLOCK_KK, ITER, SENT)
        new, l_new = _unkey(nkey, KEY32, ID_BITS)
        ok = (nkey > SENT) & m2
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
    new_w = combine_rows(new, ids_t, ok, p_new, is_own, w_own, w_t, p_k, m2, alpha, COMBINE, SLOT_R)
    return new, new_w, ok


@triton.jit
def _base_route_kernel(
    logits_ptr, yhat_ptr, b_ptr, budget_ptr, table_ptr,
    out_ids_ptr, out_w_ptr, counts_ptr, removed_ptr, ws_ptr,
    T, stride_l, stride_y, alpha,
    E: tl.constexpr, K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_KK: tl.constexpr,
    BLOCK_T: tl.constexpr, T_CHUNKS: tl.constexpr, BLOCK_B: tl.constexpr,
    SELECT: tl.constexpr, RENORM: tl.constexpr, BACKFILL: tl.constexpr, COMBINE: tl.constexpr,
    HAS_TABLE: tl.constexpr, KEY32: tl.constexpr, ITER: tl.constexpr, SCRATCH: tl.constexpr,
    COMPACT: tl.constexpr, SLOT_R: tl.constexpr, USE_PDL: tl.constexpr,
    ID_BITS: tl.constexpr, SENT: tl.constexpr, SENTINEL: tl.constexpr,
):
    pid = tl.program_id(0)
    G: tl.constexpr = 8 if BLOCK_E >= 8 else BLOCK_E  # experts per union word
    es = tl.arange(0, BLOCK_E)  # [BE]
    emask = es < E
    kk = tl.arange(0, BLOCK_KK)  # [KK] slots (also output slots j)
    kmask = kk < K
    ts = pid * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT] this program's rows
    tmask = ts < T
    m2 = tmask[:, None] & kmask[None, :]
    if SELECT:
        b_e = tl.load(b_ptr + es, mask=emask, other=0.0).to(tl.float32)  # static: before the wait
    if USE_PDL:  # wait for the producer (the router GEMM), then let the next launch start early
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # every load of this program's rows first (one round trip), the router after
    lg, valid = _load_rows(logits_ptr, stride_l, ts, tmask, es, emask)  # [BT, BE]
    if SELECT:
        yh, _v = _load_rows(yhat_ptr, stride_y, ts, tmask, es, emask)
    bud = tl.load(budget_ptr + ts, mask=tmask, other=-1)  # [BT]
    real = bud >= 0
    key, top, kth, mx, s, routed, p, tp = _route_rows(lg, valid, es, emask, kk, K, BLOCK_KK, KEY32,
                                                      ITER, ID_BITS, SENT)
    ids_t, l_own = _unkey(top, KEY32, ID_BITS)  # [BT, KK] the router's top-K, best first
    p_k = tl.where(m2, tl.exp(l_own - mx[:, None]) / s[:, None], 0.0)  # [BT, KK]
    w_t = p_k  # [BT, KK] the model's weights
    if RENORM:
        w_t = p_k / tp[:, None]
    new = ids_t
    new_w = w_t
    ok = m2
    if SELECT:
        if T_CHUNKS == 1:  # this program's rows are every row: M from their loaded budgets
            m = _rows_budget(bud, table_ptr, E, HAS_TABLE)
        else:
            m = batch_budget(budget_ptr, T, table_ptr, E, BLOCK_B, HAS_TABLE)
        # ---- batch score D over every row (each program on its own: no barrier) -----------------
        if T_CHUNKS == 1:  # this program's rows are every row
            rr = routed & real[:, None]
            in_union = _union_of(_union_bits(rr, BLOCK_T, BLOCK_E, G), es, BLOCK_E, G) & emask  # [BE]
            n_union = tl.sum(in_union.to(tl.int32), axis=0)
            if m < n_union:  # something is dropped
                w = p
                if RENORM:
                    w = p / tp[:, None]
                cost = w * w * tl.exp(2.0 * (yh + b_e[None, :]))
                d = tl.sum(tl.where(rr & (cost == cost), cost, 0.0), axis=0)  # [BE]
                new, new_w, ok = _kept_rows(
                    d, in_union, n_union, m, key, kth, ids_t, w_t, p_k, mx, s, tp, m2, es, emask, kk, pid,
                    logits_ptr, stride_l, ts, tmask, counts_ptr, removed_ptr, ws_ptr, alpha,
                    BLOCK_E, K, BLOCK_KK, RENORM, BACKFILL, COMBINE, KEY32, ITER, SCRATCH, COMPACT,
                    SLOT_R, ID_BITS, SENT)
            elif pid == 0:  # S = the union: the routing as it is
                tl.store(counts_ptr, n_union.to(tl.int64))
                tl.store(counts_ptr + 1, n_union.to(tl.int64))
                tl.store(removed_ptr, 0.0)
        else:
            d = tl.zeros([BLOCK_E], dtype=tl.float32)
            bits = tl.zeros([BLOCK_E // G], dtype=tl.int32)
            for c in tl.static_range(T_CHUNKS):  # independent chunks: their loads can overlap
                tc = c * BLOCK_T + tl.arange(0, BLOCK_T)
                tcm = tc < T
                lg_c, valid_c = _load_rows(logits_ptr, stride_l, tc, tcm, es, emask)
                yh_c, _vc = _load_rows(yhat_ptr, stride_y, tc, tcm, es, emask)
                real_c = tl.load(budget_ptr + tc, mask=tcm, other=-1) >= 0
                d_c, b_c = _chunk_score(lg_c, yh_c, valid_c, real_c, b_e, es, emask, kk, K,
                                        BLOCK_KK, RENORM, KEY32, ITER, ID_BITS, SENT, BLOCK_T,
                                        BLOCK_E, G)
                d += d_c
                bits = bits | b_c
            in_union = _union_of(bits, es, BLOCK_E, G) & emask  # [BE]
            n_union = tl.sum(in_union.to(tl.int32), axis=0)
            new, new_w, ok = _kept_rows(
                d, in_union, n_union, m, key, kth, ids_t, w_t, p_k, mx, s, tp, m2, es, emask, kk, pid,
                logits_ptr, stride_l, ts, tmask, counts_ptr, removed_ptr, ws_ptr, alpha,
                BLOCK_E, K, BLOCK_KK, RENORM, BACKFILL, COMBINE, KEY32, ITER, SCRATCH, COMPACT,
                SLOT_R, ID_BITS, SENT)
    store_rows(out_ids_ptr, out_w_ptr, ts, kk, K, new, new_w, ok & real[:, None], m2)


def compact_width(compact: int, block_e: int, K: int) -> int:
    """Columns of the compacted backfill tile for |S| <= compact: a power of two, at least
    next_pow2(K) (the top-k's width); 0 (off) where that is not narrower than the full tile."""
    if compact <= 0:
        return 0
    w = max(triton.next_power_of_2(compact), triton.next_power_of_2(K))
    return w if w < block_e else 0


def slot_order(block_t: int, block_e: int, K: int, num_warps: int) -> int:
    """combine_rows' SLOT_R: a fixed order of its slot sums, the same on both backfill paths (whose
    [BT, KK] layouts differ). With KK = 8: R = min(8, BT * BE / threads), the adjacent slots the
    router's [BT, BE] tile leaves in each thread, which is the order the kernel had before the
    narrow path wherever the runs of R sit on lanes (every default tiling; checked on the compiled
    layouts of every ROUTE_VARIANTS tiling, sm_90, Triton 3.6). KK <= 2: 0 (tl.sum, order-free);
    other KK: -1 (slot by slot)."""
    kk = triton.next_power_of_2(K)
    if kk <= 2:
        return 0
    if kk != 8:
        return -1
    return min(8, max(1, block_t * block_e // (32 * num_warps)))


def route_blocks(T: int, E: int, K: int) -> dict:
    """Tile sizes, warps and top-k method of the route-select launch for (T, E, K).
    BASE_ROUTE_TILES="num_warps,block_t,iter[,scratch[,compact]]" overrides them (benchmark sweeps
    only; compact: the narrow backfill's |S| bound, 0 off)."""
    block_e = triton.next_power_of_2(E)
    block_t = max(1, min(16, triton.next_power_of_2(max(T, 1)), 2048 // block_e))
    num_warps, it, scratch, compact = (4 if block_t * block_e <= 1024 else 8), False, True, 32
    if T == 1:  # one warp, K max-reductions: 0.2-0.5 us faster at E = 64 and 128 (H200 sweep)
        num_warps, it = 1, True
    if "BASE_ROUTE_TILES" in os.environ:
        raw = os.environ["BASE_ROUTE_TILES"]
        try:
            v = [int(x) for x in raw.split(",")]
        except ValueError:
            v = []
        if len(v) not in (3, 4, 5) or v[0] not in (1, 2, 4, 8, 16, 32) or v[1] < 1 or min(v[2:]) < 0:
            raise ValueError(f"BASE_ROUTE_TILES: expected num_warps (1-32, a power of two),rows per "
                             f"block,iter[,scratch[,compact]] as integers >= 0, got {raw!r}")
        num_warps, block_t, it = v[0], max(1, min(v[1], triton.next_power_of_2(max(T, 1)))), bool(v[2])
        scratch = bool(v[3]) if len(v) > 3 else scratch
        compact = v[4] if len(v) > 4 else compact
    return dict(BLOCK_E=block_e, BLOCK_KK=triton.next_power_of_2(K), BLOCK_T=block_t,
                T_CHUNKS=triton.next_power_of_2(triton.cdiv(max(T, 1), block_t)),
                BLOCK_B=min(1024, triton.next_power_of_2(max(T, 1))), ITER=it, SCRATCH=scratch,
                COMPACT=compact_width(compact, block_e, K),
                SLOT_R=slot_order(block_t, block_e, K, num_warps), num_warps=num_warps)


def route_outputs(logits, yhat, b, budget, K: int, ids_dtype, combine: str, alpha: float, table,
                  select: bool) -> tuple:
    """Check a route-select call's inputs (each error names its field) and allocate its outputs:
    (ids [T, K] ids_dtype, weights [T, K] fp32, counts [2] int64, removed [1] fp32), uninitialised.
    Shared by base_route_select and base_route_split (select: yhat, b, combine, table are used)."""
    T, E = logits.shape
    dev = logits.device
    check(logits.dtype in FLOAT_DTYPES and logits.stride(1) == 1,
          f"logits: needs a float dtype and unit column stride, got {logits.dtype} {logits.stride()}")
    check(1 <= K <= E and E < (1 << ID_BITS), f"top_k: must be in [1, E={E}], got {K}")
    check(ids_dtype in ID_DTYPES, f"ids_dtype: expected one of {ID_DTYPES}, got {ids_dtype}")
    check_tensor("budget", budget, (T,), ID_DTYPES, dev)
    if select:
        check(yhat is not None and yhat.dim() == 2 and tuple(yhat.shape) == (T, E)
              and yhat.dtype in FLOAT_DTYPES and yhat.stride(1) == 1 and yhat.device == dev,
              f"yhat: expected [{T}, {E}] float with unit column stride on {dev}, got "
              f"{None if yhat is None else (tuple(yhat.shape), yhat.dtype, yhat.stride(), yhat.device)}")
        check(b is not None, "b: the predictor bias is required with yhat")
        check_tensor("b", b, (E,), FLOAT_DTYPES, dev)
        check_combine(combine, alpha)
        check_table(table, E, dev)
    return (torch.empty(T, K, dtype=ids_dtype, device=dev),
            torch.empty(T, K, dtype=torch.float32, device=dev),
            torch.empty(2, dtype=torch.int64, device=dev),
            torch.empty(1, dtype=torch.float32, device=dev))


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
    select = yhat is not None
    out_ids, out_w, counts, removed = route_outputs(logits, yhat, b, budget, K, ids_dtype, combine,
                                                    alpha, table, select)
    if T == 0:
        return out_ids, out_w, counts.zero_(), removed.zero_()
    cfg = route_blocks(T, E, K)
    num_warps = cfg.pop("num_warps")
    pdl = use_pdl(dev)
    key32 = logits.dtype == torch.bfloat16 and E <= 65536  # bf16 logits order by 16 bits
    grid = (triton.cdiv(T, cfg["BLOCK_T"]),)
    ws = torch.empty(grid[0] * cfg["BLOCK_E"] if select else 1, dtype=torch.float32, device=dev)
    _base_route_kernel[grid](
        logits, yhat if select else logits, b if select else logits, budget,
        table if table is not None else logits, out_ids, out_w, counts, removed, ws,
        T, logits.stride(0), yhat.stride(0) if select else 0, float(alpha),
        E=E, K=K, **cfg, SELECT=select, RENORM=bool(renormalize), BACKFILL=backfill,
        COMBINE=COMBINE_MODES[combine], HAS_TABLE=table is not None, KEY32=key32, USE_PDL=pdl,
        ID_BITS=ID_BITS, SENT=-(1 << 31) if key32 else SENTINEL, SENTINEL=SENTINEL,
        num_warps=num_warps, **launch_kwargs(pdl))
    return out_ids, out_w, counts, removed

"""BASE scoring + selection for one MoE layer in ONE launch, every phase parallel.

Programs 0..E-1 score, a grid barrier, then programs 0..R-1 build the rows (R row chunks):
  scoring (program e = expert e: only its routed pairs' dot products)
      a[e] (the predictor row, static) is loaded BEFORE the PDL wait, so it overlaps the producer;
      yhat[t] = <hidden[t], a[e]> + b[e] for the real tokens t that route e (compacted, ROWS at a time)
      D[e]     = sum_t w[t, k]^2 exp(2 yhat[t])  in ascending t (fixed order: deterministic)
      union[e] = number of real tokens routing e
  barrier: every program arrives on one int32 counter (zeroed once), the arrivals of a launch
      adding exactly 2^20, and the row programs spin until its high bits move (no reset and no
      memset per call: graph replays need nothing; the spin is bounded). The grid is one
      cooperative launch (all programs resident), so the spin cannot wait on an unscheduled
      program. The row programs load their rows and every budget before arriving, so after the
      barrier only D (the vector, and gathered at their slots' ids) is on the critical path.
  rows (program r = rows r*BT .. r*BT+BT-1, each program on its own: no serial part)
      M      = clamp(max budget over real rows, 0, E)    (>= E anywhere -> dense; -1 = padded row)
      S      = the M union experts with the largest D (ties -> lower id): one sort of packed
               (D bits, ~id) int64 keys, threshold at the M-th key (no E x E rank tile)
      row    = routed experts in S keep their order, then (backfill) the top-(K) experts of S the
               token did not route by descending router logit (ties -> lower id): one bitonic top-k
               of packed (ordered logit bits, ~id) keys per row (no E x E "before" tile), -1 pads;
      weights as base_select (combine "always" / "never" / "partial"); a row whose ids did not
               change keeps its weights bit-exactly; padded rows: ids -1, weights 0.
Under the Triton CPU interpreter (programs run one after another, so a spin would never end) the
same kernel runs as two launches, ROLE=1 (scoring) then ROLE=2 (rows), with no barrier: the code
of each phase is the code the GPU runs. Outputs match base_sglang.core.select_experts (policies
"base", "base_plus"): ids exactly, weights to fp32 rounding. Shape legend: T tokens, K slots,
E experts, H hidden, BT rows per row program.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from base_sglang.kernels.base_select import (
    COMBINE_MODES,
    batch_budget,
    check_combine,
    check_table,
    selection_outputs,
)
from base_sglang.kernels.utils import (
    BAR_BITS,
    FLOAT_DTYPES,
    ID_DTYPES,
    barrier_buffer,
    check,
    check_tensor,
    is_interpreter,
    launch_kwargs,
    num_sms,
    use_pdl,
)

ID_BITS = 20  # low bits of a packed key hold (2^20 - 1 - expert id): E < 2^20
SENTINEL = -(1 << 62)  # key of "not a candidate": below every packed key


@triton.jit
def _score_expert(e, ids_ptr, w_ptr, budget_ptr, hidden_ptr, stride_ht, a_row, b_e, hs, hmask, T,
                  K: tl.constexpr, BLOCK_KK: tl.constexpr, BLOCK_TS: tl.constexpr,
                  ROWS: tl.constexpr):
    """(D[e], number of real tokens routing e) over all T tokens, ascending t."""
    kk = tl.arange(0, BLOCK_KK)  # [KK]
    rs = tl.arange(0, ROWS)  # [R]
    d = 0.0
    n = 0
    for t0 in range(0, T, BLOCK_TS):
        ts = t0 + tl.arange(0, BLOCK_TS)  # [BTS]
        tmask = ts < T
        m2 = tmask[:, None] & (kk < K)[None, :]
        ids_t = tl.load(ids_ptr + ts[:, None] * K + kk[None, :], mask=m2, other=-1).to(tl.int32)
        w_t = tl.load(w_ptr + ts[:, None] * K + kk[None, :], mask=m2, other=0.0).to(tl.float32)
        real = tl.load(budget_ptr + ts, mask=tmask, other=-1) >= 0  # [BTS]
        hit = (ids_t == e) & real[:, None]  # [BTS, KK] real slots routing e
        tok = tl.max(hit.to(tl.int32), axis=1)  # [BTS] 1 = token routes e
        w_sel = tl.sum(tl.where(hit, w_t, 0.0), axis=1)  # [BTS]
        rank = tl.cumsum(tok, axis=0) - tok  # [BTS] position among the routing tokens
        n_hit = tl.sum(tok, axis=0)
        for r0 in range(0, n_hit, ROWS):  # usually one group: compacted rows, ascending t
            sel = (tok[None, :] > 0) & (rank[None, :] == (r0 + rs)[:, None])  # [R, BTS]
            row_t = tl.sum(tl.where(sel, ts[None, :], 0), axis=1)  # [R] token of each row
            row_w = tl.sum(tl.where(sel, w_sel[None, :], 0.0), axis=1)  # [R]
            row_ok = r0 + rs < n_hit
            x = tl.load(hidden_ptr + row_t.to(tl.int64)[:, None] * stride_ht + hs[None, :],
                        mask=row_ok[:, None] & hmask[None, :], other=0.0).to(tl.float32)  # [R, BH]
            yhat = tl.sum(x * a_row[None, :], axis=1) + b_e  # [R]
            d += tl.sum(tl.where(row_ok, row_w * row_w * tl.exp(2.0 * yhat), 0.0), axis=0)
        n += n_hit
    return d, n


@triton.jit
def _packed(x, es, ID_BITS: tl.constexpr):
    """int64 keys ordering like (x descending, id ascending): ordered fp32 bits, then ~id."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)  # + 0.0: -0.0 -> +0.0 (equal values, equal keys)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # signed order == float order
    return ordered.to(tl.int64) * (1 << ID_BITS) + ((1 << ID_BITS) - 1 - es)


@triton.jit
def _unpack(key, ID_BITS: tl.constexpr):
    """(expert id, fp32 value) of keys made by _packed."""
    e = (1 << ID_BITS) - 1 - (key & ((1 << ID_BITS) - 1))
    ordered = (key >> ID_BITS).to(tl.int32)
    bits = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF)
    return e.to(tl.int32), bits.to(tl.float32, bitcast=True)


@triton.jit
def slot_sum(x, SLOT_R: tl.constexpr):
    """The sum over the slots of x [BT, KK]. SLOT_R 0: tl.sum (its order follows x's layout). Else a
    fixed order, whatever the layout: with KK = 8 and SLOT_R = R in {1, 2, 4, 8}, sequential within
    each run of R adjacent slots, then a butterfly over the runs from the highest run bit down, i.e.
    what tl.sum does when a thread holds R adjacent slots and the runs sit on lanes (Triton 3.6:
    in-thread values in order, then shfl.bfly from the widest lane offset); any other KK or
    SLOT_R -1: slot by slot in order (each slot taken out by an exact one-hot sum). base_route pins
    its combine sums so (its narrow backfill changes the layouts)."""
    KK: tl.constexpr = x.shape[1]
    if SLOT_R == 0:
        total = tl.sum(x, axis=1)
    elif KK == 8 and SLOT_R > 0:
        bt: tl.constexpr = x.shape[0]
        ev, od = tl.split(tl.reshape(x, [bt, 4, 2]))  # [BT, 4] slots 0, 2, 4, 6 / 1, 3, 5, 7
        e0, e1 = tl.split(tl.reshape(ev, [bt, 2, 2]))  # slots 0, 4 / 2, 6
        o0, o1 = tl.split(tl.reshape(od, [bt, 2, 2]))  # slots 1, 5 / 3, 7
        s0, s4 = tl.split(e0)
        s2, s6 = tl.split(e1)
        s1, s5 = tl.split(o0)
        s3, s7 = tl.split(o1)
        if SLOT_R == 8:
            total = ((((((s0 + s1) + s2) + s3) + s4) + s5) + s6) + s7
        elif SLOT_R == 4:
            total = (((s0 + s1) + s2) + s3) + (((s4 + s5) + s6) + s7)
        elif SLOT_R == 2:
            total = ((s0 + s1) + (s4 + s5)) + ((s2 + s3) + (s6 + s7))
        else:
            total = ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))
    else:
        kk = tl.arange(0, KK)
        total = tl.sum(tl.where(kk[None, :] == 0, x, 0.0), axis=1)
        for j in tl.static_range(1, KK):
            total = total + tl.sum(tl.where(kk[None, :] == j, x, 0.0), axis=1)
    return total


@triton.jit
def combine_rows(new, ids_t, ok, p_new, is_own, w_own, w_t, p_k, slots, alpha,
                 COMBINE: tl.constexpr, SLOT_R: tl.constexpr = 0):
    """Combine weights [BT, KK] of the selected rows (base_select's rule, rows at once).

    new / ids_t: selected and routed ids; ok: filled slots of new; p_new: router p of new's experts
    (0 where not ok); is_own / w_own: slots holding a routed expert and its routed weight; w_t, p_k:
    the routed weights and p; slots: the real (row, slot) entries. COMBINE 0 "always" (renormalise
    to the routed total W), 1 "never" (backfilled: p * W / sum p_routed), 2 "partial" (never's times
    (W / their sum) ** alpha). A row whose ids did not change keeps w_t bit-exactly. SLOT_R: the
    slot sums' order (slot_sum)."""
    total_w = slot_sum(tl.where(slots, w_t, 0.0), SLOT_R)  # [BT]
    if COMBINE == 0:  # "always"
        p_sum = slot_sum(tl.where(ok, p_new, 0.0), SLOT_R)
        new_w = p_new / tl.maximum(p_sum, 1e-30)[:, None] * total_w[:, None]
    else:  # "never", then "partial" rescales by (W / sum) ** alpha
        total_p = slot_sum(tl.where(slots, p_k, 0.0), SLOT_R)
        new_w = tl.where(is_own, w_own, p_new * (total_w / tl.maximum(total_p, 1e-30))[:, None])
        if COMBINE == 2:
            total_new = tl.maximum(slot_sum(tl.where(ok, new_w, 0.0), SLOT_R), 1e-30)
            ratio = tl.maximum(total_w / total_new, 0.0)  # [BT]
            safe = tl.where(ratio > 0.0, ratio, 1.0)
            scale = tl.where(ratio > 0.0, tl.exp(alpha * tl.log(safe)),
                             tl.where(alpha == 0.0, 1.0, 0.0))
            new_w = new_w * scale[:, None]
    unchanged = tl.sum(((new != ids_t) & slots).to(tl.int32), axis=1) == 0  # [BT]
    return tl.where(unchanged[:, None], w_t, new_w)


@triton.jit
def store_rows(out_ids_ptr, out_w_ptr, ts, kk, K: tl.constexpr, new, new_w, keep, m2):
    """Write rows ts of the selection [BT, KK]: slots outside `keep` (empty, or a padded row's)
    as id -1, weight 0; m2 masks the real (row, slot) entries."""
    new = tl.where(keep, new, -1)
    new_w = tl.where(keep, new_w, 0.0)
    offs = ts[:, None] * K + kk[None, :]
    tl.store(out_ids_ptr + offs, new.to(out_ids_ptr.dtype.element_ty), mask=m2)
    tl.store(out_w_ptr + offs, new_w.to(out_w_ptr.dtype.element_ty), mask=m2)


@triton.jit
def _base_fused_kernel(
    hidden_ptr, ids_ptr, w_ptr, logits_ptr, budget_ptr, a_ptr, b_ptr, table_ptr,
    out_ids_ptr, out_w_ptr, d_ptr, union_ptr, in_s_ptr, counts_ptr, removed_ptr, bar_ptr,
    T, stride_ht, stride_lt, stride_ae, alpha,
    H: tl.constexpr, E: tl.constexpr, K: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_KK: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_TS: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_B: tl.constexpr,
    BACKFILL: tl.constexpr, COMBINE: tl.constexpr, HAS_TABLE: tl.constexpr, ROLE: tl.constexpr,
    USE_PDL: tl.constexpr,
    ID_BITS: tl.constexpr, SENTINEL: tl.constexpr, BAR_BITS: tl.constexpr,
):
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    n_chunks = tl.cdiv(T, BLOCK_T)
    hs = tl.arange(0, BLOCK_H)  # [BH]
    hmask = hs < H
    es = tl.arange(0, BLOCK_E)  # [BE]
    emask = es < E
    kk = tl.arange(0, BLOCK_KK)  # [KK] slot ids (also output slot ids j)
    kmask = kk < K
    if ROLE != 2:  # static predictor row: read before waiting on the producer of hidden/ids
        scorer = (hs * 0 + pid) < E  # [BH] (vector: the interpreter mishandles scalar & vector masks)
        a_row = tl.load(a_ptr + pid * stride_ae + hs, mask=hmask & scorer, other=0.0)
        a_row = a_row.to(tl.float32)  # [BH]
        b_e = tl.load(b_ptr + pid, mask=pid < E, other=0.0).to(tl.float32)
    if USE_PDL:  # wait for the producer kernel, then let the next launch start early
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()

    # ---- scoring: D[e], union[e] of this program's expert ---------------------------------------
    if ROLE != 2:
        if pid < E:
            d_e, n_e = _score_expert(pid, ids_ptr, w_ptr, budget_ptr, hidden_ptr, stride_ht, a_row,
                                     b_e, hs, hmask, T, K, BLOCK_KK, BLOCK_TS, ROWS)
            tl.store(d_ptr + pid, d_e)
            tl.store(union_ptr + pid, n_e)
    if ROLE == 1:
        return
    rows = pid < n_chunks

    # ---- this program's rows and the batch budget, loaded before the barrier ---------------------
    ts = pid * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    tmask = ts < T  # false on every row of a program past the last chunk
    m2 = tmask[:, None] & kmask[None, :]
    ids_t = tl.load(ids_ptr + ts[:, None] * K + kk[None, :], mask=m2, other=-1).to(tl.int32)
    w_t = tl.load(w_ptr + ts[:, None] * K + kk[None, :], mask=m2, other=0.0).to(tl.float32)
    lrow = logits_ptr + ts.to(tl.int64)[:, None] * stride_lt
    slot_ok = m2 & (ids_t >= 0) & (ids_t < E)  # [BT, KK] routed slots
    own = tl.where(slot_ok, ids_t, 0)
    l_own = tl.load(lrow + own, mask=slot_ok, other=0.0).to(tl.float32)  # [BT, KK]
    logit = tl.load(lrow + es[None, :], mask=tmask[:, None] & emask[None, :],
                    other=float("-inf")).to(tl.float32)  # [BT, BE]
    logit = tl.where(tmask[:, None], logit, 0.0)  # rows past T: finite, never stored
    real = tl.load(budget_ptr + ts, mask=tmask, other=-1) >= 0  # [BT]
    m = batch_budget(budget_ptr, T, table_ptr, E, BLOCK_B, HAS_TABLE)

    # ---- grid barrier (GPU): every program arrives, the row programs wait for the last -----------
    if ROLE == 0:
        # the arrivals of one launch add exactly 2^BAR_BITS (program 0 adds the rest after the
        # others' 1 each), so the counter's high bits move once per launch: no reset, no memset,
        # the counter starts at a multiple of 2^BAR_BITS; a program's own arrival tells it its launch
        tl.debug_barrier()  # every thread's D/union stores happen before the arrival (release)
        inc = tl.where(pid == 0, (1 << BAR_BITS) - (n_prog - 1), 1)
        old = tl.atomic_add(bar_ptr, inc, sem="acq_rel", scope="gpu")
        high = -(1 << BAR_BITS)  # int32 mask of the launch bits
        base = old & high
        if rows:  # spin on plain volatile loads (no RMW traffic on the line), then one acquire;
            # bounded (~2^22 polls, seconds), so a broken counter cannot hang the GPU
            polls = 0
            while ((tl.load(bar_ptr, volatile=True) & high) == base) & (polls < (1 << 22)):
                polls += 1
            tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    if rows:
        # ---- kept set S: the m largest packed D keys over the union -----------------------------
        d = tl.load(d_ptr + es, mask=emask, other=0.0, cache_modifier=".cg")  # [BE] through L2
        n_u = tl.load(union_ptr + es, mask=emask, other=0, cache_modifier=".cg")
        d_own = tl.load(d_ptr + own, mask=slot_ok, other=0.0, cache_modifier=".cg")  # [BT, KK]
        u_own = tl.load(union_ptr + own, mask=slot_ok, other=0, cache_modifier=".cg")
        in_union = (n_u > 0) & emask
        key = tl.where(in_union, _packed(d, es, ID_BITS), -1)  # [BE] distinct per expert
        ranked = tl.sort(key, descending=True)  # [BE]
        kth = tl.sum(tl.where(es == m - 1, ranked, 0), axis=0)  # [] m-th largest key
        in_s = in_union & (key >= kth) & (m > 0)  # [BE]
        kept = slot_ok & (u_own > 0) & (_packed(d_own, own, ID_BITS) >= kth) & (m > 0)  # [BT, KK]
        if pid == 0:
            tl.store(in_s_ptr + es, in_s.to(tl.int8), mask=emask)
            tl.store(counts_ptr, tl.sum(in_union.to(tl.int64), axis=0))
            tl.store(counts_ptr + 1, tl.sum(in_s.to(tl.int64), axis=0))
            tl.store(removed_ptr, tl.sum(tl.where(in_union & (in_s == 0), d, 0.0), axis=0))

        # ---- router softmax over the row, evaluated where needed ---------------------------------
        w_t = tl.where(slot_ok, w_t, 0.0)  # the core zeroes the weights of -1 slots
        mx = tl.max(logit, axis=1)  # [BT]
        s = tl.sum(tl.where(emask[None, :], tl.exp(logit - mx[:, None]), 0.0), axis=1)  # [BT]
        p_k = tl.where(slot_ok, tl.exp(l_own - mx[:, None]) / s[:, None], 0.0)  # [BT, KK]

        if BACKFILL:
            ki = kept.to(tl.int32)
            pos = tl.cumsum(ki, axis=1) - ki  # [BT, KK] output slot of each kept own slot
            n_own = tl.sum(ki, axis=1)  # [BT]
            to_j = kept[:, None, :] & (pos[:, None, :] == kk[None, :, None])  # [BT, KK(j), KK(k)]
            new = tl.sum(tl.where(to_j, ids_t[:, None, :] + 1, 0), axis=2) - 1  # [BT, KK] -1 empty
            p_new = tl.sum(tl.where(to_j, p_k[:, None, :], 0.0), axis=2)
            w_own = tl.sum(tl.where(to_j, w_t[:, None, :], 0.0), axis=2)
            is_own = new >= 0
            # candidates: experts of S the token did not route, best first (one top-k per row)
            routed = tl.max(((ids_t[:, :, None] == es[None, None, :])
                             & slot_ok[:, :, None]).to(tl.int32), axis=1)  # [BT, BE] (registers)
            cand = in_s[None, :] & tmask[:, None] & (routed == 0)  # [BT, BE]
            ckey = tl.where(cand, _packed(logit, es[None, :], ID_BITS), SENTINEL)  # [BT, BE]
            top = tl.topk(ckey, BLOCK_KK)  # [BT, KK(c)] descending
            c_ok = top > SENTINEL
            c_id, c_logit = _unpack(top, ID_BITS)  # [BT, KK(c)]
            c_p = tl.where(c_ok, tl.exp(c_logit - mx[:, None]) / s[:, None], 0.0)
            c_to_j = (c_ok[:, None, :] & (kk[None, None, :] + n_own[:, None, None]
                                          == kk[None, :, None]))  # [BT, KK(j), KK(c)]
            new = new + tl.sum(tl.where(c_to_j, c_id[:, None, :] + 1, 0), axis=2)
            p_new = p_new + tl.sum(tl.where(c_to_j, c_p[:, None, :], 0.0), axis=2)
        else:  # drop only: kept own slots stay in place
            new = tl.where(kept, ids_t, -1)
            p_new = tl.where(kept, p_k, 0.0)
            w_own = w_t
            is_own = kept

        ok = (new >= 0) & kmask[None, :]  # [BT, KK]
        new_w = combine_rows(new, ids_t, ok, p_new, is_own, w_own, w_t, p_k, m2, alpha, COMBINE)
        store_rows(out_ids_ptr, out_w_ptr, ts, kk, K, new, new_w, ok & real[:, None], m2)


def fused_blocks(T: int, E: int, K: int, H: int, sms: int) -> dict:
    """Tile sizes and warps of the fused selection for (T, E, K, H) on a GPU with `sms` SMs."""
    block_e = triton.next_power_of_2(E)
    block_h = triton.next_power_of_2(H)
    # rows per row program: as few as fill the grid the scoring already launches (E programs)
    block_t = min(16, max(1, triton.next_power_of_2(triton.cdiv(T, max(E, sms)))))
    while block_t * block_e > 4096 and block_t > 1:  # [BT, BE] int64 keys: keep them in registers
        block_t //= 2
    # [ROWS, BLOCK_H] fp32 hidden rows per dot group, 4 warps: (4, ROWS=4) at H=2048 measured
    # 9.3 us against 11.4 us for (8, 8) (Qwen3 shape, T=16, H200: sweep_fused_tiles.py)
    rows = max(1, min(8, 8192 // block_h))
    return dict(BLOCK_E=block_e, BLOCK_KK=triton.next_power_of_2(K), BLOCK_H=block_h,
                BLOCK_TS=max(16, min(64, triton.next_power_of_2(max(T, 1)))), ROWS=rows,
                BLOCK_T=block_t, BLOCK_B=min(1024, triton.next_power_of_2(max(T, 1))),
                num_warps=4)


def base_fused_select(
    hidden: torch.Tensor,  # [T, H] float, row stride free, unit column stride
    ids: torch.Tensor,  # [T, K] int32/int64 contiguous, the router's top-k (-1 allowed)
    weights: torch.Tensor,  # [T, K] float contiguous, the model's combine weights
    logits: torch.Tensor,  # [T, E] float, unit column stride: router logits (preference order)
    budget: torch.Tensor,  # [T] int32/int64 contiguous on the device; -1 = padded row, >= E dense
    a: torch.Tensor,  # [E, H] fp32/bf16 predictor rows of this layer, unit column stride
    b: torch.Tensor,  # [E] fp32/bf16
    *,
    backfill: bool = True,
    combine: str = "always",  # "always" | "never" | "partial" (SelectionConfig.combine_mode)
    alpha: float = 0.5,  # exponent of "partial" (SelectionConfig.renorm_alpha), in [0, 1]
    cooperative: bool = True,  # GPU: cooperative launch (guaranteed co-residency for the barrier)
    table: torch.Tensor | None = None,  # [E+1] fp32 per-layer schedule (base_sched), or None
):
    """base_score + base_select in one launch. Returns (ids, weights, d, in_s, counts, removed)
    as base_select: ids [T, K] (ids dtype, -1 dropped), weights [T, K] (weights dtype, 0 dropped),
    d [E] fp32 batch score, in_s [E] int8 kept mask, counts [2] int64 (union, kept), removed [1].

    Contract: real rows route distinct ids in [0, E); a -1 slot is a dropped slot. No host sync;
    graph-capturable. Launches on one stream share one barrier buffer (they are serialised).
    """
    T, E = logits.shape
    K = ids.shape[1]
    H = hidden.shape[1] if hidden.dim() == 2 else -1
    dev = logits.device
    check(logits.dtype in FLOAT_DTYPES and logits.stride(1) == 1,
          f"logits: needs a float dtype and unit column stride, got {logits.dtype} {logits.stride()}")
    check(hidden.dim() == 2 and hidden.shape[0] == T and hidden.dtype in FLOAT_DTYPES
          and hidden.stride(1) == 1 and hidden.device == dev,
          f"hidden: expected [{T}, H] float with unit column stride on {dev}, got "
          f"{tuple(hidden.shape)} {hidden.dtype} {hidden.stride()} on {hidden.device}")
    check_tensor("ids", ids, (T, K), ID_DTYPES, dev)
    check_tensor("weights", weights, (T, K), FLOAT_DTYPES, dev)
    check_tensor("budget", budget, (T,), ID_DTYPES, dev)
    check(a.dim() == 2 and tuple(a.shape) == (E, H) and a.stride(1) == 1 and a.device == dev
          and a.dtype in FLOAT_DTYPES, f"a: expected [{E}, {H}] float with unit column stride on "
          f"{dev}, got {tuple(a.shape)} {a.dtype} {a.stride()} on {a.device}")
    check_tensor("b", b, (E,), FLOAT_DTYPES, dev)
    check(E < (1 << BAR_BITS) and H <= 16384 and K <= E,
          f"E, H, K: at most 2^20 experts, 16384 hidden and K <= E, got {E}, {H}, {K}")
    check_combine(combine, alpha)
    check_table(table, E, dev)
    new_ids, new_w, d, in_s, counts, removed = selection_outputs(ids, weights, E)
    union = torch.empty(E, dtype=torch.int32, device=dev)  # [E] written by the scoring programs
    if T == 0:
        return new_ids, new_w, d.zero_(), in_s.zero_(), counts.zero_(), removed.zero_()
    cfg = fused_blocks(T, E, K, H, num_sms(dev))
    num_warps = cfg.pop("num_warps")
    if "BASE_FUSED_TILES" in os.environ:  # benchmark sweeps only: "num_warps,rows"
        w_env, r_env = (int(v) for v in os.environ["BASE_FUSED_TILES"].split(","))
        num_warps, cfg["ROWS"] = w_env, r_env
    grid = (max(E, triton.cdiv(T, cfg["BLOCK_T"])),)
    args = (hidden, ids, weights, logits, budget, a, b, budget if table is None else table,
            new_ids, new_w, d, union, in_s, counts, removed, barrier_buffer(dev), T,
            hidden.stride(0), logits.stride(0), a.stride(0), float(alpha))
    consts = dict(H=H, E=E, K=K, **cfg, BACKFILL=backfill, COMBINE=COMBINE_MODES[combine],
                  HAS_TABLE=table is not None,
                  ID_BITS=ID_BITS, SENTINEL=SENTINEL, BAR_BITS=BAR_BITS, num_warps=num_warps)
    if is_interpreter() or dev.type != "cuda":  # no spin under the interpreter: two launches
        for role in (1, 2):
            _base_fused_kernel[grid](*args, **consts, ROLE=role, USE_PDL=False)
        return new_ids, new_w, d, in_s, counts, removed
    pdl = use_pdl(dev)
    extra = dict(launch_kwargs(pdl), **({"launch_cooperative_grid": True} if cooperative else {}))
    _base_fused_kernel[grid](*args, **consts, ROLE=0, USE_PDL=pdl, **extra)
    return new_ids, new_w, d, in_s, counts, removed

"""BASE scoring + selection for one MoE layer in ONE launch: predicted removal costs, batch score D,
batch budget, top-M kept set, backfill and combine weights (base_sglang.core.selection, policy "base").

Grid: one program per expert e (E programs), then the last program to finish does the selection.
  scoring (every program, its expert only: the T*K routed pairs' dot products, nothing else)
      a[e] (the predictor row, static) is loaded BEFORE the PDL wait, so it overlaps the producer;
      yhat[t] = <hidden[t], a[e]> + b[e] for the real tokens t that route e (compacted, ROWS at a time)
      D[e] = sum_t w[t, k]^2 exp(2 yhat[t])  in ascending t (fixed order: deterministic)
      union[e] = number of real tokens routing e
  hand-off: store D[e], union[e]; CTA barrier; one acq_rel atomic ticket (an integer counter, so
      the kept set never depends on float atomics or on arrival order); the program that draws the
      last ticket resets the counter (graph replays start from 0) and reads every D[e] through L2.
  selection (last program only)
      M      = clamp(max budget over real rows, 0, E)    (>= E anywhere -> dense; -1 = padded row)
      S      = the M union experts with the largest D (ties -> lower id): one bitonic sort of packed
               (D bits, ~id) int64 keys, threshold at the M-th key (no E x E rank tiles)
      rows   = per token: routed experts in S keep their order, then (backfill) the experts of S it
               did not route by descending router logit (ties -> lower id, one argmax per free
               slot), -1 pads; weights renormalised ("always") or the model's own weights for routed
               experts and p * (sum w / sum p_routed) for backfilled ones ("never"); a row whose ids
               did not change keeps its weights bit-exactly; padded rows: ids -1, weights 0.
The first row chunk (its ids, weights, logits, the logits at the routed ids, budgets) is loaded by
every program before the ticket, so the last one only waits for D (the vector, and gathered at the
slots' ids in the same round trip); per-slot lookups are gathers from memory rather than
reductions over [T, K] x [E] tiles. ids match the core exactly, weights to fp32 rounding.
Shape legend: T tokens, K slots, E experts, H hidden.
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
    ticket_buffer,
    use_pdl,
)


@triton.jit
def _select_rows(
    t0, ids_t, w_t, l_own, logit, real, in_s, kth, m, T,
    ids_ptr, d_ptr, union_ptr, out_ids_ptr, out_w_ptr,
    E: tl.constexpr, K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_KK: tl.constexpr,
    BLOCK_T: tl.constexpr, BACKFILL: tl.constexpr, RENORM: tl.constexpr,
):
    """New ids and weights of one chunk of BLOCK_T token rows (tiles already loaded). Per-slot
    lookups are gathers from memory, not [BT, KK] x [BE] reductions over register tiles: the router
    logit of each slot (before the ticket), and its expert's D and union count, from which "kept"
    follows with the same key test as the kept set (one memory round trip after the ticket, shared
    with the load of D itself)."""
    ts = t0 + tl.arange(0, BLOCK_T)  # [BT]
    tmask = ts < T
    es = tl.arange(0, BLOCK_E)  # [BE]
    emask = es < E
    kk = tl.arange(0, BLOCK_KK)  # [KK] slot ids (also output slot ids j)
    kmask = kk < K
    slot_ok = (ids_t >= 0) & (ids_t < E) & kmask[None, :] & tmask[:, None]  # [BT, KK] routed slots
    w_t = tl.where(slot_ok, w_t, 0.0)  # the core zeroes the weights of -1 slots

    # router softmax p = exp(logit - mx) / s, evaluated only where needed (no [BT, BE] p tile)
    mx = tl.max(logit, axis=1)  # [BT]
    s = tl.sum(tl.where(emask[None, :], tl.exp(logit - mx[:, None]), 0.0), axis=1)  # [BT]
    p_k = tl.where(slot_ok, tl.exp(l_own - mx[:, None]) / s[:, None], 0.0)  # [BT, KK] own slots
    own = tl.where(slot_ok, ids_t, 0)  # [BT, KK]
    d_own = tl.load(d_ptr + own, mask=slot_ok, other=0.0, cache_modifier=".cg")  # [BT, KK]
    u_own = tl.load(union_ptr + own, mask=slot_ok, other=0, cache_modifier=".cg")
    key_own = d_own.to(tl.int32, bitcast=True).to(tl.int64) * 1048576 + (1048575 - own)
    kept = slot_ok & (u_own > 0) & (key_own >= kth) & (m > 0)  # [BT, KK] own slot in S

    if BACKFILL:
        # own kept slots move to the front in slot order
        ki = kept.to(tl.int32)
        pos = tl.cumsum(ki, axis=1) - ki  # [BT, KK] output slot of each kept own slot
        n_own = tl.sum(ki, axis=1)  # [BT]
        to_j = kept[:, None, :] & (pos[:, None, :] == kk[None, :, None])  # [BT, KK(j), KK(k)]
        new = tl.sum(tl.where(to_j, ids_t[:, None, :] + 1, 0), axis=2) - 1  # [BT, KK] -1 = empty
        p_new = tl.sum(tl.where(to_j, p_k[:, None, :], 0.0), axis=2)
        w_own = tl.sum(tl.where(to_j, w_t[:, None, :], 0.0), axis=2)
        is_own = new >= 0
        # free slots: the kept experts the token did not route, by descending logit (ties -> lower id)
        cand = in_s[None, :] & tmask[:, None]  # [BT, BE]
        for k in range(K):  # a real loop: unrolled, its [BT, BE] tiles would all be live at once
            e_k = tl.load(ids_ptr + ts * K + k, mask=tmask, other=-1)  # [BT] slot k (L1 hit)
            cand = cand & (e_k[:, None] != es[None, :])
        n_fill = K - tl.min(tl.where(tmask, n_own, K), axis=0)  # [] most free slots of any row
        for i in range(0, n_fill):
            has = tl.max(cand.to(tl.int32), axis=1) > 0  # [BT]
            best = tl.max(tl.where(cand, logit, float("-inf")), axis=1)  # [BT]
            pick = tl.min(tl.where(cand & (logit == best[:, None]), es[None, :], BLOCK_E),
                          axis=1)  # [BT] lowest id among the best
            slot = n_own + i  # [BT]
            put = has & (pick < E) & (slot < K)  # [BT]
            at = (kk[None, :] == slot[:, None]) & put[:, None]  # [BT, KK]
            p_pick = tl.exp(best - mx) / s  # [BT] p of the picked expert (its logit is best)
            new = tl.where(at, pick[:, None], new)
            p_new = tl.where(at, p_pick[:, None], p_new)
            cand = cand & (es[None, :] != pick[:, None])
    else:  # drop only: kept own slots stay in place
        new = tl.where(kept, ids_t, -1)
        p_new = tl.where(kept, p_k, 0.0)
        w_own = w_t
        is_own = kept

    ok = (new >= 0) & kmask[None, :]  # [BT, KK]
    total_w = tl.sum(w_t, axis=1)  # [BT]
    if RENORM:
        p_sum = tl.sum(tl.where(ok, p_new, 0.0), axis=1)
        new_w = p_new / tl.maximum(p_sum, 1e-30)[:, None] * total_w[:, None]
    else:
        scale = total_w / tl.maximum(tl.sum(p_k, axis=1), 1e-30)  # sum w / sum p_routed
        new_w = tl.where(is_own, w_own, p_new * scale[:, None])
    unchanged = tl.sum(((new != ids_t) & kmask[None, :]).to(tl.int32), axis=1) == 0  # [BT]
    new_w = tl.where(unchanged[:, None], w_t, new_w)
    keep = ok & real[:, None]
    new = tl.where(keep, new, -1)
    new_w = tl.where(keep, new_w, 0.0)
    offs = ts[:, None] * K + kk[None, :]
    smask = tmask[:, None] & kmask[None, :]
    tl.store(out_ids_ptr + offs, new.to(out_ids_ptr.dtype.element_ty), mask=smask)
    tl.store(out_w_ptr + offs, new_w.to(out_w_ptr.dtype.element_ty), mask=smask)


@triton.jit
def _load_rows(t0, ids_ptr, w_ptr, logits_ptr, budget_ptr, T, stride_lt,
               E: tl.constexpr, K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_KK: tl.constexpr,
               BLOCK_T: tl.constexpr):
    """ids [BT, KK] int32 (-1 outside), weights [BT, KK] fp32, the router logit of each own slot
    [BT, KK] fp32, logits [BT, BE] fp32, budgets [BT] int64."""
    ts = t0 + tl.arange(0, BLOCK_T)
    tmask = ts < T
    kk = tl.arange(0, BLOCK_KK)
    es = tl.arange(0, BLOCK_E)
    m2 = tmask[:, None] & (kk < K)[None, :]
    ids_t = tl.load(ids_ptr + ts[:, None] * K + kk[None, :], mask=m2, other=-1).to(tl.int32)
    w_t = tl.load(w_ptr + ts[:, None] * K + kk[None, :], mask=m2, other=0.0).to(tl.float32)
    row = logits_ptr + ts.to(tl.int64)[:, None] * stride_lt
    own = m2 & (ids_t >= 0) & (ids_t < E)
    l_own = tl.load(row + tl.where(own, ids_t, 0), mask=own, other=0.0).to(tl.float32)
    logit = tl.load(row + es[None, :], mask=tmask[:, None] & (es < E)[None, :],
                    other=float("-inf")).to(tl.float32)
    logit = tl.where(tmask[:, None], logit, 0.0)  # rows past T: finite, never stored
    bud = tl.load(budget_ptr + ts, mask=tmask, other=-1).to(tl.int64)
    return ids_t, w_t, l_own, logit, bud


@triton.jit
def _score_chunk(t0, ids_t, w_t, bud, e, hidden_ptr, stride_ht, a_row, b_e, hs, hmask,
                 BLOCK_T: tl.constexpr, ROWS: tl.constexpr):
    """(sum of w^2 exp(2 yhat), count) over the real tokens of one chunk that route expert e."""
    ts = t0 + tl.arange(0, BLOCK_T)  # [BT]
    rs = tl.arange(0, ROWS)  # [R]
    hit = (ids_t == e) & (bud >= 0)[:, None]  # [BT, KK] real slots routing e
    tok = tl.max(hit.to(tl.int32), axis=1)  # [BT] 1 = token routes e
    w_sel = tl.sum(tl.where(hit, w_t, 0.0), axis=1)  # [BT]
    rank = tl.cumsum(tok, axis=0) - tok  # [BT] position among the routing tokens
    n_hit = tl.sum(tok, axis=0)
    d = 0.0
    for r0 in range(0, n_hit, ROWS):  # usually one group: compacted rows, ascending t
        sel = (tok[None, :] > 0) & (rank[None, :] == (r0 + rs)[:, None])  # [R, BT]
        row_t = tl.sum(tl.where(sel, ts[None, :], 0), axis=1)  # [R] token of each row
        row_w = tl.sum(tl.where(sel, w_sel[None, :], 0.0), axis=1)  # [R]
        row_ok = r0 + rs < n_hit
        x = tl.load(hidden_ptr + row_t.to(tl.int64)[:, None] * stride_ht + hs[None, :],
                    mask=row_ok[:, None] & hmask[None, :], other=0.0).to(tl.float32)  # [R, BH]
        yhat = tl.sum(x * a_row[None, :], axis=1) + b_e  # [R]
        d += tl.sum(tl.where(row_ok, row_w * row_w * tl.exp(2.0 * yhat), 0.0), axis=0)
    return d, n_hit


@triton.jit
def _base_select_kernel(
    hidden_ptr, ids_ptr, w_ptr, logits_ptr, budget_ptr, a_ptr, b_ptr,
    out_ids_ptr, out_w_ptr, d_ptr, union_ptr, in_s_ptr, counts_ptr, removed_ptr, ticket_ptr,
    T, H, stride_ht, stride_lt, stride_ae,
    E: tl.constexpr, K: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_KK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    ROWS: tl.constexpr, BACKFILL: tl.constexpr, RENORM: tl.constexpr, USE_PDL: tl.constexpr,
):
    e = tl.program_id(0)  # this program's expert
    hs = tl.arange(0, BLOCK_H)  # [BH]
    hmask = hs < H
    # static predictor row: read before waiting on the producer of hidden/ids
    a_row = tl.load(a_ptr + e * stride_ae + hs, mask=hmask, other=0.0).to(tl.float32)  # [BH]
    b_e = tl.load(b_ptr + e).to(tl.float32)
    if USE_PDL:  # wait for the producer kernel, then let the next launch start early
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    kk = tl.arange(0, BLOCK_KK)  # [KK]

    # first row chunk: also what the selection below needs, loaded before the ticket
    ids0, w0, lown0, logit0, bud0 = _load_rows(0, ids_ptr, w_ptr, logits_ptr, budget_ptr, T,
                                               stride_lt, E, K, BLOCK_E, BLOCK_KK, BLOCK_T)

    # ---- scoring: D[e] over the real tokens that route e ------------------------------------
    d_e, n_e = _score_chunk(0, ids0, w0, bud0, e, hidden_ptr, stride_ht, a_row, b_e, hs, hmask,
                            BLOCK_T, ROWS)
    for t0 in range(BLOCK_T, T, BLOCK_T):  # only when T > BLOCK_T
        ts = t0 + tl.arange(0, BLOCK_T)
        tmask = ts < T
        m2 = tmask[:, None] & (kk < K)[None, :]
        ids_t = tl.load(ids_ptr + ts[:, None] * K + kk[None, :], mask=m2, other=-1).to(tl.int32)
        w_t = tl.load(w_ptr + ts[:, None] * K + kk[None, :], mask=m2, other=0.0).to(tl.float32)
        bud = tl.load(budget_ptr + ts, mask=tmask, other=-1).to(tl.int64)
        d_c, n_c = _score_chunk(t0, ids_t, w_t, bud, e, hidden_ptr, stride_ht, a_row, b_e, hs,
                                hmask, BLOCK_T, ROWS)
        d_e += d_c
        n_e += n_c
    tl.store(d_ptr + e, d_e)
    tl.store(union_ptr + e, n_e)

    # ---- hand-off: the last program to finish selects ----------------------------------------
    tl.debug_barrier()  # every thread's stores above happen before the ticket (release)
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == E - 1:
        tl.store(ticket_ptr, 0)  # ready for the next launch (graph replay)
        es = tl.arange(0, BLOCK_E)  # [BE]
        emask = es < E
        d = tl.load(d_ptr + es, mask=emask, other=0.0, cache_modifier=".cg")  # [BE] through L2
        n_u = tl.load(union_ptr + es, mask=emask, other=0, cache_modifier=".cg")
        in_union = (n_u > 0) & emask

        # batch budget M = largest real budget, clamped to [0, E]
        m = tl.max(tl.where(bud0 >= 0, bud0, 0), axis=0)
        for t0 in range(BLOCK_T, T, BLOCK_T):
            ts = t0 + tl.arange(0, BLOCK_T)
            b_t = tl.load(budget_ptr + ts, mask=ts < T, other=-1).to(tl.int64)
            m = tl.maximum(m, tl.max(tl.where(b_t >= 0, b_t, 0), axis=0))
        m = tl.minimum(m, E)

        # kept set: the m largest packed keys (D >= 0, so its fp32 bits order like D; ~id breaks ties)
        bits = d.to(tl.int32, bitcast=True).to(tl.int64)
        key = tl.where(in_union, bits * 1048576 + (1048575 - es), -1)  # [BE] distinct per expert
        ranked = tl.sort(key, descending=True)  # [BE]
        kth = tl.sum(tl.where(es == m - 1, ranked, 0), axis=0)  # [] m-th largest key
        in_s = in_union & (key >= kth) & (m > 0)  # [BE]

        tl.store(in_s_ptr + es, in_s.to(tl.int8), mask=emask)
        tl.store(counts_ptr, tl.sum(in_union.to(tl.int64), axis=0))
        tl.store(counts_ptr + 1, tl.sum(in_s.to(tl.int64), axis=0))
        tl.store(removed_ptr, tl.sum(tl.where(in_union & (in_s == 0), d, 0.0), axis=0))

        _select_rows(0, ids0, w0, lown0, logit0, bud0 >= 0, in_s, kth, m, T, ids_ptr, d_ptr,
                     union_ptr, out_ids_ptr, out_w_ptr, E, K, BLOCK_E, BLOCK_KK, BLOCK_T,
                     BACKFILL, RENORM)
        for t0 in range(BLOCK_T, T, BLOCK_T):
            ids_t, w_t, l_own, logit, bud = _load_rows(t0, ids_ptr, w_ptr, logits_ptr, budget_ptr,
                                                       T, stride_lt, E, K, BLOCK_E, BLOCK_KK,
                                                       BLOCK_T)
            _select_rows(t0, ids_t, w_t, l_own, logit, bud >= 0, in_s, kth, m, T, ids_ptr,
                         d_ptr, union_ptr, out_ids_ptr, out_w_ptr, E, K, BLOCK_E, BLOCK_KK,
                         BLOCK_T, BACKFILL, RENORM)


def select_blocks(T: int, E: int, K: int, H: int) -> dict:
    """Tile sizes and warps of the selection kernel for (T, E, K, H)."""
    block_e = triton.next_power_of_2(E)
    block_h = triton.next_power_of_2(H)
    # row chunk: [BLOCK_T, BLOCK_E] tiles of 2K elements (8 fp32 registers each at 8 warps); at 4K
    # the selection rows spill (ptxas, sm_90a: 255 registers + local memory at E=128)
    block_t = max(16, min(64 if block_h <= 2048 else 32, 2048 // block_e,
                          triton.next_power_of_2(max(T, 1))))
    # [ROWS, BLOCK_H] fp32 hidden rows per dot group: 16K elements spill past H=2048 (sm_90a)
    rows = max(1, min(8, (16384 if block_h <= 2048 else 8192) // block_h))
    return dict(BLOCK_E=block_e, BLOCK_KK=triton.next_power_of_2(K), BLOCK_T=block_t,
                BLOCK_H=block_h, ROWS=rows, num_warps=8 if block_h * rows >= 16384 else 4)


def base_select(
    hidden: torch.Tensor,  # [T, H] float, row stride free, unit column stride
    ids: torch.Tensor,  # [T, K] int32/int64 contiguous, the router's top-k (-1 allowed)
    weights: torch.Tensor,  # [T, K] float contiguous, the model's combine weights
    logits: torch.Tensor,  # [T, E] float, unit column stride: router logits (preference order)
    budget: torch.Tensor,  # [T] int32/int64 contiguous on the device; -1 = padded row, >= E dense
    a: torch.Tensor,  # [E, H] fp32/bf16 predictor rows of this layer, unit column stride
    b: torch.Tensor,  # [E] fp32/bf16
    *,
    backfill: bool = True,
    renorm: bool = True,  # True: "always" (renormalise the final set); False: "never"
):
    """Apply BASE to one MoE layer's routing in one launch. Returns (ids, weights, d, in_s, counts,
    removed): ids [T, K] (ids dtype, -1 dropped), weights [T, K] (weights dtype, 0 dropped), d [E]
    fp32 batch score, in_s [E] int8 kept mask, counts [2] int64 (union size, kept size), removed [1]
    fp32.

    Contract: real rows route distinct ids in [0, E); a -1 slot is a dropped slot. No host sync;
    graph-capturable (budgets are read from `budget` on the device at run time). One launch per
    call uses a per-(device, stream) integer ticket counter: calls on one stream are serialised,
    concurrent calls on different streams get different counters.
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
    check(E < (1 << 20) and H <= 16384, f"E, H: at most 2^20 experts and 16384 hidden, got {E}, {H}")
    new_ids = torch.empty_like(ids)
    new_w = torch.empty_like(weights)
    # NOTE: empty, not zeros: the kernel writes every element (no memset launches)
    d = torch.empty(E, dtype=torch.float32, device=dev)
    union = torch.empty(E, dtype=torch.int32, device=dev)
    in_s = torch.empty(E, dtype=torch.int8, device=dev)
    counts = torch.empty(2, dtype=torch.int64, device=dev)
    removed = torch.empty(1, dtype=torch.float32, device=dev)
    if T == 0:
        return new_ids, new_w, d.zero_(), in_s.zero_(), counts.zero_(), removed.zero_()
    cfg = select_blocks(T, E, K, H)
    num_warps = cfg.pop("num_warps")
    pdl = use_pdl(dev)
    _base_select_kernel[(E,)](
        hidden, ids, weights, logits, budget, a, b,
        new_ids, new_w, d, union, in_s, counts, removed, ticket_buffer(dev),
        T, H, hidden.stride(0), logits.stride(0), a.stride(0),
        E=E, K=K, **cfg, BACKFILL=backfill, RENORM=renorm, USE_PDL=pdl, num_warps=num_warps,
        **launch_kwargs(pdl))
    return new_ids, new_w, d, in_s, counts, removed

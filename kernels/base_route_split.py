"""The router's softmax top-k and BASE's selection in TWO launches, from a folded router GEMM.

Same inputs, outputs and rules as base_route_select (kernels/base_route.py); the work is split so
that no program recomputes another program's rows:
  launch 1 (program r = rows r*BT .. r*BT+BT-1)  the router's top-k of its rows (ids, weights: the
           routing, written to the outputs), the rows' softmax max, denominator, routed mass, K-th
           key and routed p (to a workspace), and its chunk's share of the batch score
              part[r, e] = sum over its real rows t routing e of w[t, e]^2 exp(2 (a.z + b)[t, e])
              bits[r]    = its rows' union as G-bit words (base_route._union_bits)
  launch 2 (the same programs)  D = part[0] + part[1] + ... in chunk order (fixed: deterministic;
           the sums of base_route_select's multi-chunk path, bit for bit, at the same BT), the union
           = OR of bits, M, S and its rows' backfill and weights (base_route._kept_rows: the scratch
           row sort, the narrow backfill on S's columns), overwriting the routing of its rows when
           something is dropped (M < |union|) and leaving it as it is otherwise.
The one-launch kernel's chain at T > BT repeats the router and the scoring of every chunk in every
program; here each program routes BT rows once, and launch 2 starts (PDL) while launch 1 drains.
Workspace per call: part [R, BE] fp32, bits [R, BE / G] int32, rows [T, 3] fp32 (max, denominator,
routed mass), kth [T] int64, p_k [T, KK] fp32, scratch [R, BE] fp32. R = cdiv(T, BT) programs.
The oracle is base_sglang.core.select_experts fed the same top-k and log_norms (core.routing).
Shape legend: T tokens, K slots, E experts, BT rows per program, KK = next_pow2(K).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from base_sglang.kernels.base_fused import ID_BITS, SENTINEL, store_rows
from base_sglang.kernels.base_route import (
    _kept_rows,
    _key,
    _load_rows,
    _route_rows,
    _union_bits,
    _union_of,
    _unkey,
    compact_width,
    route_outputs,
    slot_order,
)
from base_sglang.kernels.base_select import COMBINE_MODES, batch_budget
from base_sglang.kernels.utils import (
    launch_kwargs,
    use_pdl,
)


@triton.jit
def _split_route_kernel(
    logits_ptr, yhat_ptr, b_ptr, budget_ptr,
    out_ids_ptr, out_w_ptr, part_ptr, bits_ptr, rows_ptr, kth_ptr, pk_ptr,
    T, stride_l, stride_y,
    E: tl.constexpr, K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_KK: tl.constexpr,
    BLOCK_T: tl.constexpr, RENORM: tl.constexpr, KEY32: tl.constexpr, ITER: tl.constexpr,
    USE_PDL: tl.constexpr, ID_BITS: tl.constexpr, SENT: tl.constexpr,
):
    pid = tl.program_id(0)
    G: tl.constexpr = 8 if BLOCK_E >= 8 else BLOCK_E  # experts per union word
    es = tl.arange(0, BLOCK_E)  # [BE]
    emask = es < E
    kk = tl.arange(0, BLOCK_KK)  # [KK]
    kmask = kk < K
    ts = pid * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT] this program's rows
    tmask = ts < T
    m2 = tmask[:, None] & kmask[None, :]
    b_e = tl.load(b_ptr + es, mask=emask, other=0.0).to(tl.float32)  # static: before the wait
    if USE_PDL:  # wait for the router GEMM, then let launch 2 start early
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    lg, valid = _load_rows(logits_ptr, stride_l, ts, tmask, es, emask)  # [BT, BE]
    yh, _v = _load_rows(yhat_ptr, stride_y, ts, tmask, es, emask)  # [BT, BE]
    real = tl.load(budget_ptr + ts, mask=tmask, other=-1) >= 0  # [BT]
    key, top, kth, mx, s, routed, p, tp = _route_rows(lg, valid, es, emask, kk, K, BLOCK_KK, KEY32,
                                                      ITER, ID_BITS, SENT)
    ids_t, l_own = _unkey(top, KEY32, ID_BITS)  # [BT, KK] the router's top-K, best first
    p_k = tl.where(m2, tl.exp(l_own - mx[:, None]) / s[:, None], 0.0)  # [BT, KK]
    w_t = p_k
    if RENORM:
        w_t = p_k / tp[:, None]
    # ---- this chunk's share of D and of the union (base_route._chunk_score's sums) ----------------
    rr = routed & real[:, None]
    w = p  # [BT, BE] the routed weights (where routed)
    if RENORM:
        w = p / tp[:, None]
    cost = w * w * tl.exp(2.0 * (yh + b_e[None, :]))
    d = tl.sum(tl.where(rr & (cost == cost), cost, 0.0), axis=0)  # [BE] a NaN row scores nothing
    bits = _union_bits(rr, BLOCK_T, BLOCK_E, G)  # [BE / G]
    gs = tl.arange(0, BLOCK_E // G)
    tl.store(part_ptr + pid * BLOCK_E + es, d)
    tl.store(bits_ptr + pid * (BLOCK_E // G) + gs, bits)
    # ---- what launch 2 needs of these rows, and the routing itself --------------------------------
    tl.store(rows_ptr + ts * 3, mx, mask=tmask)
    tl.store(rows_ptr + ts * 3 + 1, s, mask=tmask)
    tl.store(rows_ptr + ts * 3 + 2, tp, mask=tmask)
    tl.store(kth_ptr + ts, kth.to(tl.int64), mask=tmask)
    tl.store(pk_ptr + ts[:, None] * BLOCK_KK + kk[None, :], p_k, mask=m2)
    store_rows(out_ids_ptr, out_w_ptr, ts, kk, K, ids_t, w_t, m2 & real[:, None], m2)


@triton.jit
def _split_select_kernel(
    logits_ptr, budget_ptr, table_ptr,
    out_ids_ptr, out_w_ptr, part_ptr, bits_ptr, rows_ptr, kth_ptr, pk_ptr,
    counts_ptr, removed_ptr, ws_ptr,
    T, stride_l, alpha,
    E: tl.constexpr, K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_KK: tl.constexpr,
    BLOCK_T: tl.constexpr, N_CHUNKS: tl.constexpr, BLOCK_B: tl.constexpr,
    RENORM: tl.constexpr, BACKFILL: tl.constexpr, COMBINE: tl.constexpr, HAS_TABLE: tl.constexpr,
    KEY32: tl.constexpr, ITER: tl.constexpr, SCRATCH: tl.constexpr, COMPACT: tl.constexpr,
    SLOT_R: tl.constexpr, USE_PDL: tl.constexpr, ID_BITS: tl.constexpr, SENT: tl.constexpr,
):
    pid = tl.program_id(0)
    G: tl.constexpr = 8 if BLOCK_E >= 8 else BLOCK_E
    es = tl.arange(0, BLOCK_E)  # [BE]
    emask = es < E
    kk = tl.arange(0, BLOCK_KK)  # [KK]
    kmask = kk < K
    ts = pid * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    tmask = ts < T
    m2 = tmask[:, None] & kmask[None, :]
    gs = tl.arange(0, BLOCK_E // G)
    if USE_PDL:  # wait for launch 1 (its writes are visible after the wait)
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    n_chunks = tl.cdiv(T, BLOCK_T)
    d = tl.zeros([BLOCK_E], dtype=tl.float32)
    words = tl.zeros([BLOCK_E // G], dtype=tl.int32)
    for c in tl.static_range(N_CHUNKS):  # independent loads; the adds in chunk order
        # (vector masks: chunk c exists when c < n_chunks)
        d += tl.load(part_ptr + c * BLOCK_E + es, mask=es * 0 + c < n_chunks, other=0.0)
        words = words | tl.load(bits_ptr + c * (BLOCK_E // G) + gs, mask=gs * 0 + c < n_chunks,
                                other=0)
    m = batch_budget(budget_ptr, T, table_ptr, E, BLOCK_B, HAS_TABLE)
    in_union = _union_of(words, es, BLOCK_E, G) & emask  # [BE]
    n_union = tl.sum(in_union.to(tl.int32), axis=0)
    if m < n_union:  # something is dropped: rebuild this program's rows
        real = tl.load(budget_ptr + ts, mask=tmask, other=-1) >= 0  # [BT]
        lg, valid = _load_rows(logits_ptr, stride_l, ts, tmask, es, emask)  # [BT, BE]
        key = tl.where(valid, _key(lg, es[None, :], KEY32, ID_BITS), SENT)  # [BT, BE]
        offs = ts[:, None] * K + kk[None, :]
        ids_t = tl.load(out_ids_ptr + offs, mask=m2, other=-1).to(tl.int32)  # [BT, KK] the routing
        w_t = tl.load(out_w_ptr + offs, mask=m2, other=0.0).to(tl.float32)
        p_k = tl.load(pk_ptr + ts[:, None] * BLOCK_KK + kk[None, :], mask=m2, other=0.0)
        mx = tl.load(rows_ptr + ts * 3, mask=tmask, other=0.0)
        s = tl.load(rows_ptr + ts * 3 + 1, mask=tmask, other=1.0)
        tp = tl.load(rows_ptr + ts * 3 + 2, mask=tmask, other=1.0)
        kth = tl.load(kth_ptr + ts, mask=tmask, other=0)
        if KEY32:
            kth = kth.to(tl.int32)
        new, new_w, ok = _kept_rows(
            d, in_union, n_union, m, key, kth, ids_t, w_t, p_k, mx, s, tp, m2, es, emask, kk, pid,
            logits_ptr, stride_l, ts, tmask, counts_ptr, removed_ptr, ws_ptr, alpha,
            BLOCK_E, K, BLOCK_KK, RENORM, BACKFILL, COMBINE, KEY32, ITER, SCRATCH, COMPACT,
            SLOT_R, ID_BITS, SENT)
        store_rows(out_ids_ptr, out_w_ptr, ts, kk, K, new, new_w, ok & real[:, None], m2)
    elif pid == 0:  # S = the union: the routing launch 1 wrote stands
        tl.store(counts_ptr, n_union.to(tl.int64))
        tl.store(counts_ptr + 1, n_union.to(tl.int64))
        tl.store(removed_ptr, 0.0)


def split_blocks(T: int, E: int, K: int) -> dict:
    """Rows per program, warps (launch 1, launch 2) and top-k method of the split launches.
    BASE_ROUTE_SPLIT_TILES="block_t,warps1,warps2[,iter[,compact]]" overrides them (benchmark
    sweeps only)."""
    block_e = triton.next_power_of_2(E)
    # 4 rows and 4 warps per program, backfill on the full [4, BE] tile: the fastest at Qwen3 T = 8,
    # 16 (one H200 sweep, eighth session: 10.8 / 10.9 us against 11.8 with 8 rows and the narrow
    # backfill); at a tile this small the narrow path's reload costs more than it saves
    block_t = max(1, min(4, triton.next_power_of_2(max(T, 1)), 2048 // block_e))
    warps1 = warps2 = 4
    it, compact = False, 0
    if "BASE_ROUTE_SPLIT_TILES" in os.environ:
        raw = os.environ["BASE_ROUTE_SPLIT_TILES"]
        try:
            v = [int(x) for x in raw.split(",")]
        except ValueError:
            v = []
        ok_w = (1, 2, 4, 8, 16, 32)
        if len(v) not in (3, 4, 5) or v[0] < 1 or v[1] not in ok_w or v[2] not in ok_w or min(v[3:] + [0]) < 0:
            raise ValueError(f"BASE_ROUTE_SPLIT_TILES: expected block_t (>= 1),warps1,warps2 (1-32, "
                             f"powers of two)[,iter[,compact]] as integers, got {raw!r}")
        block_t = triton.next_power_of_2(min(v[0], triton.next_power_of_2(max(T, 1))))
        warps1, warps2 = v[1], v[2]
        it = bool(v[3]) if len(v) > 3 else it
        compact = v[4] if len(v) > 4 else compact
    chunks = triton.cdiv(max(T, 1), block_t)
    return dict(BLOCK_E=block_e, BLOCK_KK=triton.next_power_of_2(K), BLOCK_T=block_t,
                N_CHUNKS=triton.next_power_of_2(chunks), BLOCK_B=min(1024, triton.next_power_of_2(max(T, 1))),
                ITER=it, COMPACT=compact_width(compact, block_e, K),
                SLOT_R=slot_order(block_t, block_e, K, warps2), warps1=warps1, warps2=warps2)


def base_route_split(
    logits: torch.Tensor,  # [T, E] float, unit column stride (the folded GEMM's first E columns)
    yhat: torch.Tensor,  # [T, E] float a.z, unit column stride (its next E columns)
    b: torch.Tensor,  # [E] float predictor bias of this layer
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
    """base_route_select's result in two launches. Returns (ids [T, K] ids_dtype, -1 dropped;
    weights [T, K] fp32, 0 dropped; counts [2] int64 (union, kept); removed [1] fp32).

    Contract: T rows of finite logits; K <= E. No host sync; graph-capturable (budgets are read on
    the device; the workspace is allocated per call, as the outputs are).
    """
    T, E = logits.shape
    dev = logits.device
    K = int(top_k)
    out_ids, out_w, counts, removed = route_outputs(logits, yhat, b, budget, K, ids_dtype, combine,
                                                    alpha, table, select=True)
    if T == 0:
        return out_ids, out_w, counts.zero_(), removed.zero_()
    cfg = split_blocks(T, E, K)
    warps1, warps2 = cfg.pop("warps1"), cfg.pop("warps2")
    be, kk, bt = cfg["BLOCK_E"], cfg["BLOCK_KK"], cfg["BLOCK_T"]
    grid = (triton.cdiv(T, bt),)
    G = 8 if be >= 8 else be
    f32 = dict(dtype=torch.float32, device=dev)
    part = torch.empty(grid[0] * be, **f32)
    bits = torch.empty(grid[0] * (be // G), dtype=torch.int32, device=dev)
    rows = torch.empty(T * 3, **f32)
    kth = torch.empty(T, dtype=torch.int64, device=dev)
    pk = torch.empty(T * kk, **f32)
    ws = torch.empty(grid[0] * be, **f32)
    pdl = use_pdl(dev)
    key32 = logits.dtype == torch.bfloat16 and E <= 65536  # bf16 logits order by 16 bits
    sent = -(1 << 31) if key32 else SENTINEL
    common = dict(E=E, K=K, BLOCK_E=be, BLOCK_KK=kk, BLOCK_T=bt, RENORM=bool(renormalize),
                  KEY32=key32, ITER=cfg["ITER"], USE_PDL=pdl, ID_BITS=ID_BITS, SENT=sent)
    _split_route_kernel[grid](
        logits, yhat, b, budget, out_ids, out_w, part, bits, rows, kth, pk,
        T, logits.stride(0), yhat.stride(0), **common, num_warps=warps1, **launch_kwargs(pdl))
    _split_select_kernel[grid](
        logits, budget, table if table is not None else logits, out_ids, out_w, part, bits, rows,
        kth, pk, counts, removed, ws, T, logits.stride(0), float(alpha), **common,
        N_CHUNKS=cfg["N_CHUNKS"], BLOCK_B=cfg["BLOCK_B"], BACKFILL=backfill,
        COMBINE=COMBINE_MODES[combine], HAS_TABLE=table is not None, SCRATCH=True,
        COMPACT=cfg["COMPACT"], SLOT_R=cfg["SLOT_R"], num_warps=warps2, **launch_kwargs(pdl))
    return out_ids, out_w, counts, removed

"""Group the kept (token, expert) pairs by expert into GEMM row blocks, in one single-program launch.

Pairs are the flat slots p = t*K + k of ids [T, K]; a slot whose id is -1 (dropped) or outside
[0, E) is skipped, so an expert that no slot selects gets no block and its weights are never read.
    pair_list [E, P]  int32  pair_list[e, :counts[e]] = the pairs routed to e, in ascending p
    counts    [E]     int32
    block_expert, block_row [max_blocks] int32   block b covers rows block_row[b] .. +BLOCK_M of
                                                  expert block_expert[b]'s list
    num_blocks [1]    int32  blocks actually used; the GEMM grid is max_blocks wide and the rest exit
All shapes depend on (T, K, E, BLOCK_M) only: no host sync, graph-capturable.
Two kernels give the same outputs: a one-hot scan over [BLOCK_P, BLOCK_E] tiles, and one sort of all
pair keys (expert * BLOCK_P + pair); use_sort picks (BASE_MOE_ALIGN=auto|sort|scan).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from base_sglang.kernels.utils import ID_DTYPES, check, check_tensor, launch_kwargs, use_pdl


class MoeBlocks(NamedTuple):
    pair_list: torch.Tensor  # [E, P] int32
    counts: torch.Tensor  # [E] int32
    block_expert: torch.Tensor  # [max_blocks] int32
    block_row: torch.Tensor  # [max_blocks] int32
    num_blocks: torch.Tensor  # [1] int32
    block_m: int


@triton.jit
def _moe_align_kernel(
    ids_ptr, pair_list_ptr, counts_ptr, block_expert_ptr, block_row_ptr, num_blocks_ptr,
    P,
    E: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_M: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:  # wait for the producer kernel, then let the next launch start early
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    es = tl.arange(0, BLOCK_E)  # [BE]
    emask = es < E
    cnt = tl.zeros([BLOCK_E], dtype=tl.int32)
    for p0 in range(0, P, BLOCK_P):
        ps = p0 + tl.arange(0, BLOCK_P)  # [BP]
        e_p = tl.load(ids_ptr + ps, mask=ps < P, other=-1).to(tl.int32)
        oh = (e_p[:, None] == es[None, :]) & emask[None, :] & (ps < P)[:, None]  # [BP, BE]
        ohi = oh.to(tl.int32)
        before = tl.cumsum(ohi, axis=0) - ohi + cnt[None, :]  # [BP, BE] earlier pairs of e
        rank = tl.sum(tl.where(oh, before, 0), axis=1)  # [BP] row of pair p in its expert's list
        valid = tl.sum(ohi, axis=1) > 0
        e_safe = tl.where(valid, e_p, 0)
        tl.store(pair_list_ptr + e_safe * P + rank, ps, mask=valid)
        cnt += tl.sum(ohi, axis=0)
    tl.store(counts_ptr + es, cnt, mask=emask)
    nb = (cnt + BLOCK_M - 1) // BLOCK_M  # [BE] blocks per expert (0 for an expert with no pair)
    first = tl.cumsum(nb, axis=0) - nb  # [BE] first block of each expert
    for i in range(0, tl.max(nb, axis=0)):
        m = (i < nb) & emask
        tl.store(block_expert_ptr + first + i, es, mask=m)
        tl.store(block_row_ptr + first + i, es * 0 + i * BLOCK_M, mask=m)
    tl.store(num_blocks_ptr + es, es * 0 + tl.sum(nb, axis=0), mask=es == 0)


@triton.jit
def _max_op(a, b):
    return tl.maximum(a, b)


@triton.jit
def _moe_align_sort_kernel(
    ids_ptr, pair_list_ptr, counts_ptr, block_expert_ptr, block_row_ptr, num_blocks_ptr,
    P,
    E: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_M: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """The same outputs as _moe_align_kernel from one sort of all BLOCK_P >= P pair keys
    (expert * BLOCK_P + pair, dropped slots keyed past every expert) instead of [BP, BE] one-hot scans."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    ps = tl.arange(0, BLOCK_P)  # [BP]
    e_p = tl.load(ids_ptr + ps, mask=ps < P, other=-1).to(tl.int32)
    valid = (e_p >= 0) & (e_p < E) & (ps < P)
    key = tl.where(valid, e_p, E) * BLOCK_P + ps  # [BP] distinct
    sk = tl.sort(key)  # [BP] ascending: experts in order, each expert's pairs ascending
    se = sk // BLOCK_P  # [BP] expert of sorted slot i (E = dropped)
    sp = sk % BLOCK_P  # [BP] its pair
    prev = tl.gather(se, tl.maximum(ps - 1, 0), axis=0)  # [BP] expert of slot i - 1
    start = tl.where((ps == 0) | (se != prev), ps, 0)
    start = tl.associative_scan(start, 0, _max_op)  # [BP] first sorted slot of i's expert
    rank = ps - start  # [BP] row of pair sp in expert se's list
    ok = se < E
    tl.store(pair_list_ptr + tl.where(ok, se, 0) * P + rank, sp, mask=ok)
    es = tl.arange(0, BLOCK_E)  # [BE]
    emask = es < E
    cnt = tl.histogram(tl.where(ok, se, BLOCK_E), 2 * BLOCK_E)  # [2 BE]: bin BLOCK_E = dropped
    cnt = tl.gather(cnt, es, axis=0).to(tl.int32)  # [BE]
    cnt = tl.where(emask, cnt, 0)
    tl.store(counts_ptr + es, cnt, mask=emask)
    nb = (cnt + BLOCK_M - 1) // BLOCK_M  # [BE]
    first = tl.cumsum(nb, axis=0) - nb  # [BE]
    for i in range(0, tl.max(nb, axis=0)):
        m = (i < nb) & emask
        tl.store(block_expert_ptr + first + i, es, mask=m)
        tl.store(block_row_ptr + first + i, es * 0 + i * BLOCK_M, mask=m)
    tl.store(num_blocks_ptr + es, es * 0 + tl.sum(nb, axis=0), mask=es == 0)


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound on the number of blocks: every active expert may end in a partial block."""
    return (num_pairs + min(num_experts, num_pairs) * (block_m - 1)) // block_m


SORT_MAX_PAIRS = 4096  # the sort align holds every pair key of the launch in one program
SORT_MIN_EXPERTS = 16  # auto: below it the one-hot scan is as fast (Mixtral E = 8: sort/scan 0.78-1.15)
ALIGN_MODES = ("auto", "sort", "scan")
ALIGN_MODE = os.environ.get("BASE_MOE_ALIGN", "auto")  # the default of moe_align(sort=None), read at import
if ALIGN_MODE not in ALIGN_MODES:
    raise ValueError(f"BASE_MOE_ALIGN: one of {', '.join(ALIGN_MODES)}, got {ALIGN_MODE!r}")


def use_sort(num_pairs: int, num_experts: int, mode: str = ALIGN_MODE) -> bool:
    """auto = sort for E >= SORT_MIN_EXPERTS (H200: 2.5-6x faster than the scan at E = 64/128, T = 1..128)."""
    if num_pairs > SORT_MAX_PAIRS or mode == "scan":
        return False
    return mode == "sort" or num_experts >= SORT_MIN_EXPERTS


def moe_align(ids: torch.Tensor, num_experts: int, block_m: int, *, sort: bool | None = None) -> MoeBlocks:
    """ids [T, K] int32/int64 contiguous (-1 = dropped slot) -> MoeBlocks (see the module docstring).

    sort: one sort of the pair keys (up to SORT_MAX_PAIRS pairs) instead of one-hot scans; the same
    outputs. None = use_sort(P, E) under BASE_MOE_ALIGN=auto|sort|scan (read at import)."""
    check(ids.dim() == 2, f"ids: expected [T, K], got shape {tuple(ids.shape)}")
    check_tensor("ids", ids, tuple(ids.shape), ID_DTYPES, ids.device)
    check(block_m >= 16 and block_m & (block_m - 1) == 0, f"block_m: power of 2 >= 16, got {block_m}")
    P = ids.numel()
    E = int(num_experts)
    dev = ids.device
    nb_max = max(max_blocks(P, E, block_m), 1)
    out = MoeBlocks(
        pair_list=torch.empty((E, max(P, 1)), dtype=torch.int32, device=dev),
        counts=torch.empty(E, dtype=torch.int32, device=dev),
        block_expert=torch.empty(nb_max, dtype=torch.int32, device=dev),
        block_row=torch.empty(nb_max, dtype=torch.int32, device=dev),
        num_blocks=torch.empty(1, dtype=torch.int32, device=dev),  # written by the kernel
        block_m=block_m,
    )
    if P == 0:
        out.counts.zero_()
        out.num_blocks.zero_()
        return out
    block_e = triton.next_power_of_2(E)
    pdl = use_pdl(dev)
    if use_sort(P, E, ALIGN_MODE if sort is None else "sort" if sort else "scan"):
        block_p = max(16, triton.next_power_of_2(P))
        _moe_align_sort_kernel[(1,)](
            ids, out.pair_list, out.counts, out.block_expert, out.block_row, out.num_blocks, P,
            E=E, BLOCK_E=block_e, BLOCK_P=block_p, BLOCK_M=block_m, USE_PDL=pdl,
            num_warps=8 if block_p >= 1024 else 4, **launch_kwargs(pdl))
        return out
    _moe_align_kernel[(1,)](
        ids, out.pair_list, out.counts, out.block_expert, out.block_row, out.num_blocks, P,
        E=E, BLOCK_E=block_e, BLOCK_P=max(16, min(128, 16384 // block_e)), BLOCK_M=block_m,
        USE_PDL=pdl, num_warps=8 if block_e >= 128 else 4, **launch_kwargs(pdl))
    return out

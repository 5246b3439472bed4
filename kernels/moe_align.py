"""Group the kept (token, expert) pairs by expert into GEMM row blocks, in one single-program launch.

Pairs are the flat slots p = t*K + k of ids [T, K]; a slot whose id is -1 (dropped) or outside
[0, E) is skipped, so an expert that no slot selects gets no block and its weights are never read.
    pair_list [E, P]  int32  pair_list[e, :counts[e]] = the pairs routed to e, in ascending p
    counts    [E]     int32
    block_expert, block_row [max_blocks] int32   block b covers rows block_row[b] .. +BLOCK_M of
                                                  expert block_expert[b]'s list
    num_blocks [1]    int32  blocks actually used; the GEMM grid is max_blocks wide and the rest exit
All shapes depend on (T, K, E, BLOCK_M) only: no host sync, graph-capturable.
"""

from __future__ import annotations

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


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound on the number of blocks: every active expert may end in a partial block."""
    return (num_pairs + min(num_experts, num_pairs) * (block_m - 1)) // block_m


def moe_align(ids: torch.Tensor, num_experts: int, block_m: int) -> MoeBlocks:
    """ids [T, K] int32/int64 contiguous (-1 = dropped slot) -> MoeBlocks (see the module docstring)."""
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
    _moe_align_kernel[(1,)](
        ids, out.pair_list, out.counts, out.block_expert, out.block_row, out.num_blocks, P,
        E=E, BLOCK_E=block_e, BLOCK_P=max(16, min(128, 16384 // block_e)), BLOCK_M=block_m,
        USE_PDL=pdl, num_warps=8 if block_e >= 128 else 4, **launch_kwargs(pdl))
    return out

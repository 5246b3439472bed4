"""Grouped expert GEMM over the row blocks of `moe_align`: out[p] = act(a[p // A_DIV] @ w[e].T).

One program computes a BLOCK_M x BLOCK_N tile for one block (one expert): it gathers up to BLOCK_M
rows of `a` through the block's pair list, streams w[e] in BLOCK_K steps and accumulates in fp32.
    gated (gate/up):  a = hidden [T, H] (A_DIV = K), w = gate_up [E, 2I, H]; each program reads the
                      gate rows n and the up rows I + n and writes silu(gate) * up -> out [P, I]
    plain (down):     a = act [P, I] (A_DIV = 1), w = down [E, H, I] -> out [P, H]
Programs whose block index is >= num_blocks return before touching any weight, and no block exists
for an expert without a kept pair, so dropped experts cost no HBM traffic. Pair-major (blocks None):
block p is slot p of ids alone, so no align is needed (fused_moe uses it at T = 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from base_sglang.kernels.moe_align import MoeBlocks
from base_sglang.kernels.utils import check, is_interpreter, launch_kwargs, use_pdl


@dataclass(frozen=True)
class GemmConfig:
    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3
    n_fast: bool = False  # grid order: N tiles of one block adjacent (True) or blocks adjacent


@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, out_ptr, pair_list_ptr, counts_ptr, block_expert_ptr, block_row_ptr,
    num_blocks_ptr, ids_ptr,
    N, KD, P, stride_am, stride_we, stride_wn, stride_om,
    A_DIV: tl.constexpr, GATED: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr,
    N_FAST: tl.constexpr, PAIR_MAJOR: tl.constexpr, E: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:  # wait for the producer kernel, then let the next launch start early
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if N_FAST:
        pid_n = tl.program_id(0)
        b = tl.program_id(1)
    else:
        b = tl.program_id(0)
        pid_n = tl.program_id(1)
    ms = tl.arange(0, BLOCK_M)  # [BM]
    if PAIR_MAJOR:  # block b = pair b alone (row 0 of a BLOCK_M tile), straight from ids: no align
        e = tl.load(ids_ptr + b).to(tl.int64)
        if (e < 0) | (e >= E):
            return
        rmask = ms == 0
        pair = (b + ms * 0).to(tl.int64)  # [BM]
    else:
        if b >= tl.load(num_blocks_ptr):
            return
        e = tl.load(block_expert_ptr + b).to(tl.int64)
        rows = tl.load(block_row_ptr + b) + ms  # [BM] rows of expert e's list
        rmask = rows < tl.load(counts_ptr + e)
        pair = tl.load(pair_list_ptr + e * P + rows, mask=rmask, other=0).to(tl.int64)  # [BM]
    ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    nmask = ns < N
    ks = tl.arange(0, BLOCK_K)  # [BK]
    a_ptrs = a_ptr + (pair // A_DIV)[:, None] * stride_am + ks[None, :]  # [BM, BK]
    w_ptrs = w_ptr + e * stride_we + ns[None, :].to(tl.int64) * stride_wn + ks[:, None]  # [BK, BN]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if GATED:
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        up_off = N * stride_wn
    for k0 in range(0, KD, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=rmask[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=nmask[None, :], other=0.0)
        else:
            kmask = ks < KD - k0
            a = tl.load(a_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
        if DOT_F32:  # NOTE: the CPU interpreter (triton 3.9) computes bf16 dots wrongly
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, w, acc)
        if GATED:
            if EVEN_K:
                wu = tl.load(w_ptrs + up_off, mask=nmask[None, :], other=0.0)
            else:
                wu = tl.load(w_ptrs + up_off, mask=kmask[:, None] & nmask[None, :], other=0.0)
            if DOT_F32:
                wu = wu.to(tl.float32)
            acc_up = tl.dot(a, wu, acc_up)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up  # silu(gate) * up
    out_ptrs = out_ptr + pair[:, None] * stride_om + ns[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & nmask[None, :])


def moe_gemm(
    a: torch.Tensor,  # [R, KD] bf16/fp16, unit column stride (R = T for gated, P for plain)
    w: torch.Tensor,  # [E, NW, KD] contiguous, NW = 2N (gated) or N, same dtype as a
    out: torch.Tensor,  # [P, N] unit column stride, any float dtype
    blocks: MoeBlocks | None,
    *,
    a_div: int,  # pair p reads row p // a_div of a (K for hidden, 1 for per-pair rows)
    gated: bool,
    config: GemmConfig = GemmConfig(),
    ids: torch.Tensor | None = None,  # [T, K] int32/int64 contiguous, for blocks None
) -> torch.Tensor:
    """Grouped GEMM over the kept pairs; rows of `out` for dropped pairs are left untouched.

    blocks None: pair-major, every slot p of ids is its own block (one row of a BLOCK_M=16 tile),
    read straight from ids: no align; an expert is read once per slot that keeps it.
    """
    E, NW, KD = w.shape
    N = NW // 2 if gated else NW
    pair_major = blocks is None
    check(not pair_major or (ids is not None and ids.dim() == 2 and ids.is_contiguous()
                             and ids.dtype in (torch.int32, torch.int64)),
          "ids: the pair-major GEMM (blocks None) needs contiguous int32/int64 ids [T, K]")
    P = ids.numel() if pair_major else blocks.pair_list.shape[1]
    check(a.dim() == 2 and a.shape[1] == KD and a.stride(1) == 1,
          f"a: expected [R, {KD}] with unit column stride, got {tuple(a.shape)} {a.stride()}")
    check(a.dtype == w.dtype and a.dtype in (torch.bfloat16, torch.float16),
          f"a, w: need the same bf16/fp16 dtype, got {a.dtype} and {w.dtype}")
    check(w.is_contiguous(), "w: must be contiguous [E, NW, KD]")
    check(not gated or NW % 2 == 0, f"w: gated needs an even row count, got {NW}")
    check(out.dim() == 2 and out.shape[1] == N and out.shape[0] >= P and out.stride(1) == 1,
          f"out: expected [{P}, {N}] with unit column stride, got {tuple(out.shape)}")
    check(pair_major or blocks.counts.shape[0] == E,
          f"blocks: built for {0 if pair_major else blocks.counts.shape[0]} experts, w has {E}")
    grid = (P if pair_major else blocks.block_expert.shape[0], triton.cdiv(N, config.block_n))
    if config.n_fast:
        grid = grid[::-1]
    if grid[0] * grid[1] == 0:
        return out
    meta = (ids,) * 5 if pair_major else (
        blocks.pair_list, blocks.counts, blocks.block_expert, blocks.block_row, blocks.num_blocks)
    pdl = use_pdl(a.device)
    _moe_gemm_kernel[grid](
        a, w, out, *meta, ids if pair_major else blocks.counts,
        N, KD, P, a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        A_DIV=a_div, GATED=gated, EVEN_K=KD % config.block_k == 0, DOT_F32=is_interpreter(),
        N_FAST=config.n_fast, PAIR_MAJOR=pair_major, E=E if pair_major else 0,
        BLOCK_M=16 if pair_major else blocks.block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, USE_PDL=pdl, num_warps=config.num_warps,
        num_stages=config.num_stages, **launch_kwargs(pdl))
    return out

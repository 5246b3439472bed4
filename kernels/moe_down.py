"""Decode MoE, launch 2 of 2: down GEMM with the weighted combine fused in, no atomics.

One program per BLOCK_N columns of the output (H / BLOCK_N programs, ~one per SM), looping over
every block of `moe_up`'s table in one flattened, software-pipelined loop:
    part[r, n] = act[pair_r] . down_e[h0 + n]                 fp32, the block's BLOCK_M rows
    y[t, h0 + n] += w_r * part[r, n]   for the row r of token t  (a one-hot [T, BLOCK_M] fp32 "ieee"
                                                                  dot: one exact product per entry)
Each program owns its output columns for all tokens, so the sum over a token's experts runs in a
fixed order (ascending expert id) inside one program: deterministic, and the combine launch and
the per-pair fp32 buffer of the 4-launch path are gone. Tokens whose slots are all dropped get 0.
Shape legend: T tokens, H hidden, I expert intermediate, BLOCK_M rows per block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from base_sglang.kernels.moe_up import DecodeBlocks
from base_sglang.kernels.utils import check, is_interpreter, launch_kwargs, num_sms, use_pdl


@triton.jit
def _moe_down_kernel(
    act_ptr, down_ptr, y_ptr, blk_e_ptr, blk_pair_ptr, blk_tok_ptr, blk_w_ptr, nblk_ptr,
    T, H, I, stride_de, stride_dn, stride_yt,  # noqa: E741
    BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_F32: tl.constexpr, FLATTEN: tl.constexpr, USE_PDL: tl.constexpr,
):
    h0 = tl.program_id(0) * BLOCK_N
    if USE_PDL:  # wait for moe_up, then let the next launch start early
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    num_blocks = tl.load(nblk_ptr)
    ts = tl.arange(0, BLOCK_T)  # [BT]
    rs = tl.arange(0, BLOCK_M)  # [BM]
    ns = tl.arange(0, BLOCK_N)  # [BN]
    ks = tl.arange(0, BLOCK_K)  # [BK]
    nmask = h0 + ns < H
    acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)  # [BT, BN] y columns h0.. of every token
    for b in tl.range(0, num_blocks, flatten=FLATTEN):
        e = tl.load(blk_e_ptr + b).to(tl.int64)
        pair = tl.load(blk_pair_ptr + b * BLOCK_M + rs)  # [BM] -1 past the block's last pair
        row_ok = pair >= 0
        a_ptrs = act_ptr + tl.where(row_ok, pair, 0).to(tl.int64)[:, None] * I + ks[None, :]
        w_ptrs = (down_ptr + e * stride_de + (h0 + ns).to(tl.int64)[None, :] * stride_dn
                  + ks[:, None])  # [BK, BN] K-major
        part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            if EVEN_K:
                a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
                w = tl.load(w_ptrs, mask=nmask[None, :], other=0.0)
            else:
                kmask = ks < I - k0
                a = tl.load(a_ptrs, mask=row_ok[:, None] & kmask[None, :], other=0.0)
                w = tl.load(w_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
            if DOT_F32:  # NOTE: the CPU interpreter computes bf16 dots wrongly
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            part = tl.dot(a, w, part)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        tok = tl.load(blk_tok_ptr + b * BLOCK_M + rs)  # [BM]
        w_r = tl.load(blk_w_ptr + b * BLOCK_M + rs)  # [BM]
        scatter = tl.where((tok[None, :] == ts[:, None]) & row_ok[None, :], w_r[None, :], 0.0)
        acc = tl.dot(scatter, part, acc, input_precision="ieee")  # [BT, BN] += w_r * part[r]
    out = y_ptr + ts.to(tl.int64)[:, None] * stride_yt + (h0 + ns)[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=(ts < T)[:, None] & nmask[None, :])


def down_block_n(H: int, sms: int) -> int:
    """Output columns per program: the smallest power of 2 >= 16 that needs at most one program per
    multiprocessor (H=2048: 16 on 132 SMs; H=4096: 32)."""
    bn = 16
    while triton.cdiv(H, bn) > sms and bn < 256:
        bn *= 2
    return bn


def moe_down(
    act: torch.Tensor,  # [T*K, I] from moe_up (rows of kept pairs), unit column stride
    down: torch.Tensor,  # [E, H, I] contiguous, act's dtype
    blocks: DecodeBlocks,
    out: torch.Tensor,  # [T, H] output, unit column stride
    *,
    block_n: int = 0,  # 0: down_block_n(H)
    block_k: int = 256,
    num_warps: int = 4,
    num_stages: int = 4,
    flatten: bool = True,
) -> torch.Tensor:
    """y = sum over kept slots of w * down_e(act), every output element written."""
    T, H = out.shape
    E, H2, I = down.shape  # noqa: E741
    check(H2 == H and out.stride(1) == 1, f"out: expected [T, {H2}] with unit column stride, "
          f"got {tuple(out.shape)}")
    check(act.dim() == 2 and act.shape[1] == I and act.stride(1) == 1 and act.dtype == down.dtype,
          f"act: expected [P, {I}] {down.dtype} with unit column stride, got {tuple(act.shape)} "
          f"{act.dtype}")
    check(T <= 128, f"out: the decode path takes at most 128 tokens, got {T}")
    if T == 0:
        return out
    bn = block_n or down_block_n(H, num_sms(out.device))
    pdl = use_pdl(out.device)
    _moe_down_kernel[(triton.cdiv(H, bn),)](
        act, down, out, blocks.blk_e, blocks.blk_pair, blocks.blk_tok, blocks.blk_w, blocks.nblk,
        T, H, I, down.stride(0), down.stride(1), out.stride(0),
        BLOCK_T=max(16, triton.next_power_of_2(T)), BLOCK_M=blocks.block_m, BLOCK_N=bn,
        BLOCK_K=block_k, EVEN_K=I % block_k == 0, DOT_F32=is_interpreter(), FLATTEN=flatten,
        USE_PDL=pdl,
        num_warps=num_warps, num_stages=num_stages, **launch_kwargs(pdl))
    return out

"""Decode MoE, launch 1 of 2: the align folded into a persistent gate/up GEMM with SiLU*up.

No separate align launch: every program counts the T*K ids per expert itself (one-hot integer sums,
as moe_align: deterministic) and derives the same block list, experts in ascending id, each split in
blocks of BLOCK_M of its pairs in ascending pair order:
    nb[e] = ceil(count[e] / BLOCK_M), blocks of e = [first[e], first[e] + nb[e])
Work items are (n-tile j of I, block b), numbered j-major (the blocks of one expert for one n-tile
run side by side, so a second block of a popular expert re-reads its weight tile from L2), and the
programs (a fixed grid, ~one per SM) take them round-robin in one flattened, software-pipelined
loop: no launch or pipeline fill per tile, and an expert that no slot selects is never read.
    act[p, n]  = silu(x_t . gate_e[n]) * (x_t . up_e[n])   bf16, for every kept pair p = t*K + k
The program that handles (j = 0, b) also writes block b's row table for `moe_down`:
    blk_e [NB_MAX]            expert of block b
    blk_pair, blk_tok, blk_w [NB_MAX, BLOCK_M]   pair, token and combine weight of each row
                                                  (-1, -1, 0 on unused rows)
When BLOCK_M equals BLOCK_T (the tokens, padded to a power of 2 >= 16), every expert fits one
block and row r is token r (no compaction); otherwise the block's rows are compacted pairs.
    nblk [1]                  blocks used (program 0)
Rows of act for dropped pairs and table rows past nblk are left unwritten (never read).
Shape legend: T tokens, K slots, E experts, H hidden, I expert intermediate, P = T*K pairs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from base_sglang.kernels.utils import check, is_interpreter, launch_kwargs, num_sms, use_pdl


class DecodeBlocks(NamedTuple):
    blk_e: torch.Tensor  # [NB_MAX] int32
    blk_pair: torch.Tensor  # [NB_MAX, BLOCK_M] int32
    blk_tok: torch.Tensor  # [NB_MAX, BLOCK_M] int32
    blk_w: torch.Tensor  # [NB_MAX, BLOCK_M] fp32
    nblk: torch.Tensor  # [1] int32
    block_m: int


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound on the blocks: every active expert may end in a partial block."""
    return max((num_pairs + min(num_experts, num_pairs) * (block_m - 1)) // block_m, 1)


@triton.jit
def _moe_up_kernel(
    hidden_ptr, ids_ptr, w_ptr, gu_ptr, act_ptr,
    blk_e_ptr, blk_pair_ptr, blk_tok_ptr, blk_w_ptr, nblk_ptr,
    T, H, I, stride_ht, stride_ge, stride_gn, num_progs,  # noqa: E741
    E: tl.constexpr, K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_KK: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr, FLATTEN: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    if USE_PDL:  # wait for the producer of ids/hidden, then let moe_down launch and wait early
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # ---- the align, in registers: per-expert counts and block offsets -------------------------
    P = T * K
    es = tl.arange(0, BLOCK_E)  # [BE]
    count = tl.zeros([BLOCK_E], dtype=tl.int32)  # [BE] kept pairs per expert
    for p0 in range(0, P, BLOCK_P):
        ps = p0 + tl.arange(0, BLOCK_P)  # [BP] flat pairs
        e_p = tl.load(ids_ptr + ps, mask=ps < P, other=-1).to(tl.int32)
        hit = (e_p[:, None] == es[None, :]) & (es < E)[None, :]  # [BP, BE] (-1 matches nothing)
        count += tl.sum(hit.to(tl.int32), axis=0)
    nb = (count + BLOCK_M - 1) // BLOCK_M  # [BE] blocks per expert
    cnb = tl.cumsum(nb, axis=0)  # [BE] inclusive
    first = cnb - nb  # [BE] first block of each expert
    num_blocks = tl.sum(nb, axis=0)
    if pid == 0:
        tl.store(nblk_ptr, num_blocks)
    ts = tl.arange(0, BLOCK_T)  # [BT]
    kk = tl.arange(0, BLOCK_KK)  # [KK]
    m2 = (ts < T)[:, None] & (kk < K)[None, :]
    ids_t = tl.load(ids_ptr + ts[:, None] * K + kk[None, :], mask=m2, other=-1).to(tl.int32)
    w_t = tl.load(w_ptr + ts[:, None] * K + kk[None, :], mask=m2, other=0.0).to(tl.float32)
    rs = tl.arange(0, BLOCK_M)  # [BM]
    ns = tl.arange(0, BLOCK_N)  # [BN]
    ks = tl.arange(0, BLOCK_K)  # [BK]
    n_tiles = tl.cdiv(I, BLOCK_N)

    # ---- (n-tile, block) items, round-robin over the programs, one flattened pipelined loop ----
    for item in tl.range(pid, num_blocks * n_tiles, num_progs, flatten=FLATTEN):
        j = item // num_blocks
        b = item - j * num_blocks
        e = tl.sum((cnb <= b).to(tl.int32), axis=0)  # [] expert of block b
        rb = b - tl.sum(tl.where(es == e, first, 0), axis=0)  # [] block index within expert e
        cnt = tl.sum(tl.where(es == e, count, 0), axis=0)
        match = ids_t == e  # [BT, KK]
        tok = tl.max(match.to(tl.int32), axis=1)  # [BT] 1 = token routes e
        k_e = tl.sum(tl.where(match, kk[None, :], 0), axis=1)  # [BT] slot of e in the token's row
        w_e = tl.sum(tl.where(match, w_t, 0.0), axis=1)  # [BT]
        if BLOCK_M == BLOCK_T:  # one block holds any expert's pairs: rows = tokens, no compaction
            row_ok = tok > 0
            # NOTE: not plain `ts`: with a loop-invariant row vector the flattened loop is not
            # software-pipelined (triton 3.6, sm_90a: no cp.async prefetch; compile_sm90.py checks)
            row_t = tl.where(row_ok, ts, 0)
            row_k = k_e
            row_w = w_e
        else:  # compact e's pairs: row r of block rb = the (rb * BLOCK_M + r)-th routing token
            rank = tl.cumsum(tok, axis=0) - tok  # [BT] row of the token in e's pair list
            want = rb * BLOCK_M + rs  # [BM] rows of this block
            sel = (tok[None, :] > 0) & (rank[None, :] == want[:, None])  # [BM, BT]
            row_t = tl.sum(tl.where(sel, ts[None, :], 0), axis=1)  # [BM] token of each row
            row_k = tl.sum(tl.where(sel, k_e[None, :], 0), axis=1)  # [BM]
            row_w = tl.sum(tl.where(sel, w_e[None, :], 0.0), axis=1)  # [BM]
            row_ok = want < cnt  # [BM]
        row_p = tl.where(row_ok, row_t * K + row_k, -1)  # [BM] pair index
        if j == 0:  # block table for moe_down
            tl.store(blk_e_ptr + b, e)
            tl.store(blk_pair_ptr + b * BLOCK_M + rs, row_p)
            tl.store(blk_tok_ptr + b * BLOCK_M + rs, tl.where(row_ok, row_t, -1))
            tl.store(blk_w_ptr + b * BLOCK_M + rs, tl.where(row_ok, row_w, 0.0))
        n0 = j * BLOCK_N
        nmask = n0 + ns < I  # [BN]
        a_ptrs = hidden_ptr + row_t.to(tl.int64)[:, None] * stride_ht + ks[None, :]  # [BM, BK]
        g_ptrs = (gu_ptr + e.to(tl.int64) * stride_ge + (n0 + ns).to(tl.int64)[None, :] * stride_gn
                  + ks[:, None])  # [BK, BN] gate rows n0.., K-major
        up_off = I * stride_gn.to(tl.int64)  # up rows follow the gate rows
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            if EVEN_K:
                a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
                wg = tl.load(g_ptrs, mask=nmask[None, :], other=0.0)
                wu = tl.load(g_ptrs + up_off, mask=nmask[None, :], other=0.0)
            else:
                kmask = ks < H - k0
                a = tl.load(a_ptrs, mask=row_ok[:, None] & kmask[None, :], other=0.0)
                wg = tl.load(g_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
                wu = tl.load(g_ptrs + up_off, mask=kmask[:, None] & nmask[None, :], other=0.0)
            if DOT_F32:  # NOTE: the CPU interpreter computes bf16 dots wrongly
                a = a.to(tl.float32)
                wg = wg.to(tl.float32)
                wu = wu.to(tl.float32)
            acc_g = tl.dot(a, wg, acc_g)
            acc_u = tl.dot(a, wu, acc_u)
            a_ptrs += BLOCK_K
            g_ptrs += BLOCK_K
        act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u  # [BM, BN] silu(gate) * up
        out = act_ptr + row_p.to(tl.int64)[:, None] * I + (n0 + ns)[None, :]
        tl.store(out, act.to(act_ptr.dtype.element_ty), mask=row_ok[:, None] & nmask[None, :])


def moe_up(
    hidden: torch.Tensor,  # [T, H] bf16/fp16, unit column stride
    ids: torch.Tensor,  # [T, K] int32/int64 contiguous, -1 = dropped slot
    weights: torch.Tensor,  # [T, K] float contiguous, the combine weights (copied to the table)
    gate_up: torch.Tensor,  # [E, 2I, H] contiguous, hidden's dtype
    act: torch.Tensor,  # [T*K, I] output rows per pair, unit column stride
    *,
    block_m: int = 16,
    block_n: int = 16,
    block_k: int = 256,
    num_warps: int = 4,
    num_stages: int = 4,
    programs_per_sm: int = 1,
    flatten: bool = True,
) -> DecodeBlocks:
    """Gate/up GEMM + SiLU*up over the kept pairs; returns the block table moe_down consumes."""
    T, H = hidden.shape
    E, two_i, _ = gate_up.shape
    I = two_i // 2  # noqa: E741
    K = ids.shape[1]
    P = T * K
    dev = hidden.device
    check(T <= 128, f"hidden: the decode path takes at most 128 tokens, got {T}")
    check(act.shape[0] >= P and act.shape[1] == I and act.stride(1) == 1,
          f"act: expected [{P}, {I}] with unit column stride, got {tuple(act.shape)}")
    for name, v in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        check(v >= 16 and v & (v - 1) == 0, f"{name}: power of 2 >= 16, got {v}")
    nb_max = max_blocks(P, E, block_m)
    blocks = DecodeBlocks(
        blk_e=torch.empty(nb_max, dtype=torch.int32, device=dev),
        blk_pair=torch.empty((nb_max, block_m), dtype=torch.int32, device=dev),
        blk_tok=torch.empty((nb_max, block_m), dtype=torch.int32, device=dev),
        blk_w=torch.empty((nb_max, block_m), dtype=torch.float32, device=dev),
        nblk=torch.empty(1, dtype=torch.int32, device=dev),
        block_m=block_m,
    )
    if P == 0:
        blocks.nblk.zero_()
        return blocks
    n_items = nb_max * triton.cdiv(I, block_n)
    grid = max(1, min(num_sms(dev) * programs_per_sm, n_items))
    pdl = use_pdl(dev)
    _moe_up_kernel[(grid,)](
        hidden, ids, weights, gate_up, act,
        blocks.blk_e, blocks.blk_pair, blocks.blk_tok, blocks.blk_w, blocks.nblk,
        T, H, I, hidden.stride(0), gate_up.stride(0), gate_up.stride(1), grid,
        E=E, K=K, BLOCK_E=triton.next_power_of_2(E), BLOCK_KK=triton.next_power_of_2(K),
        BLOCK_T=max(16, triton.next_power_of_2(T)),
        BLOCK_P=max(16, min(triton.next_power_of_2(P), 4096 // triton.next_power_of_2(E))),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        EVEN_K=H % block_k == 0, DOT_F32=is_interpreter(), FLATTEN=flatten, USE_PDL=pdl,
        num_warps=num_warps, num_stages=num_stages, **launch_kwargs(pdl))
    return blocks

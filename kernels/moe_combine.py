"""Weighted combine of each token's pair outputs: y[t] = sum_k w[t, k] * x[t*K + k] over kept slots.

The sum runs over k in slot order in fp32 (deterministic, no atomics). Slots with id -1 or outside
[0, E) are never read, so their rows of x may hold anything (they are left unwritten by moe_gemm).
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


@triton.jit
def _moe_combine_kernel(
    y_ptr, x_ptr, ids_ptr, w_ptr,
    H, stride_ym, stride_xm,
    E: tl.constexpr, K: tl.constexpr, BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:  # wait for the producer kernel, then let the next launch start early
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0)
    hs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BH]
    hmask = hs < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for k in tl.static_range(K):
        e = tl.load(ids_ptr + t * K + k + hs * 0)  # [BH] broadcast of one slot id
        wk = tl.load(w_ptr + t * K + k + hs * 0).to(tl.float32)
        use = (e >= 0) & (e < E) & hmask
        x = tl.load(x_ptr + (t * K + k) * stride_xm + hs, mask=use, other=0.0).to(tl.float32)
        acc += tl.where(use, wk * x, 0.0)
    tl.store(y_ptr + t * stride_ym + hs, acc.to(y_ptr.dtype.element_ty), mask=hmask)


def moe_combine(
    x: torch.Tensor,  # [P, H] per-pair expert outputs (P = T*K), unit column stride
    ids: torch.Tensor,  # [T, K] int32/int64 contiguous, -1 = dropped
    weights: torch.Tensor,  # [T, K] float contiguous
    num_experts: int,
    out: torch.Tensor,  # [T, H] output, unit column stride
) -> torch.Tensor:
    T, K = ids.shape
    H = out.shape[1]
    dev = ids.device
    check_tensor("ids", ids, (T, K), ID_DTYPES, dev)
    check_tensor("weights", weights, (T, K), FLOAT_DTYPES, dev)
    check(x.dim() == 2 and x.shape[0] >= T * K and x.shape[1] == H and x.stride(1) == 1,
          f"x: expected [{T * K}, {H}] with unit column stride, got {tuple(x.shape)}")
    check(out.shape[0] == T and out.stride(1) == 1, f"out: expected [{T}, H], got {tuple(out.shape)}")
    if T == 0:
        return out
    block_h = min(triton.next_power_of_2(H), 1024)
    grid = (T, triton.cdiv(H, block_h))
    pdl = use_pdl(dev)
    _moe_combine_kernel[grid](out, x, ids, weights, H, out.stride(0), x.stride(0),
                              E=num_experts, K=K, BLOCK_H=block_h, USE_PDL=pdl, num_warps=4,
                              **launch_kwargs(pdl))
    return out

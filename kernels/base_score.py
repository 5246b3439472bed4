"""BASE scoring: predicted removal cost of every routed (token, expert) pair.

    yhat[t, k] = <hidden[t], a[ids[t, k]]> + b[ids[t, k]]      (predicted log ||E_u(z_t)||)
    cost[t, k] = weights[t, k]^2 * exp(2 * yhat[t, k])           (0 for padded rows, budget < 0)

Only the routed rows of the predictor are read (at most T*K rows of a [E, H]). Each program owns
BLOCK_K slots of one token and streams H in BLOCK_H chunks, accumulating in fp32. The per-expert batch
score D[e] = sum of cost over the pairs routed to e is reduced deterministically (fixed order, no
atomics) inside `base_select`, which needs every pair's cost first.
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
    use_pdl,
)


@triton.jit
def _base_score_kernel(
    hidden_ptr, ids_ptr, w_ptr, budget_ptr, a_ptr, b_ptr, cost_ptr,
    H, stride_ht, stride_ae,
    K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:  # wait for the producer kernel, then let the next launch start early
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)  # [BLOCK_K] slots of token t
    kmask = ks < K
    e = tl.load(ids_ptr + t * K + ks, mask=kmask, other=-1).to(tl.int64)  # [BLOCK_K]
    real = tl.load(budget_ptr + t + ks * 0) >= 0  # [BLOCK_K] (vector: the interpreter mishandles scalar & vector masks)
    ok = kmask & (e >= 0) & real
    e_safe = tl.where(ok, e, 0)
    acc = tl.zeros([BLOCK_K, BLOCK_H], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)  # [BLOCK_H]
        hmask = hs < H
        x = tl.load(hidden_ptr + t * stride_ht + hs, mask=hmask, other=0.0).to(tl.float32)
        rows = tl.load(a_ptr + e_safe[:, None] * stride_ae + hs[None, :],
                       mask=ok[:, None] & hmask[None, :], other=0.0).to(tl.float32)  # [BK, BH]
        acc += rows * x[None, :]
    yhat = tl.sum(acc, axis=1) + tl.load(b_ptr + e_safe, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + t * K + ks, mask=kmask, other=0.0).to(tl.float32)
    cost = tl.where(ok, w * w * tl.exp(2.0 * yhat), 0.0)
    tl.store(cost_ptr + t * K + ks, cost, mask=kmask)


def base_score(
    hidden: torch.Tensor,  # [T, H] float, row stride free, unit column stride
    ids: torch.Tensor,  # [T, K] int32/int64 contiguous, the router's top-k
    weights: torch.Tensor,  # [T, K] float contiguous, the model's combine weights
    budget: torch.Tensor,  # [T] int32/int64 contiguous; < 0 marks a padded row
    a: torch.Tensor,  # [E, H] fp32/bf16 predictor rows of this layer, unit column stride
    b: torch.Tensor,  # [E] fp32/bf16
    out: torch.Tensor | None = None,  # [T, K] fp32
) -> torch.Tensor:
    """Predicted removal cost c = w^2 exp(2 yhat) of each routed pair, [T, K] fp32 (0 on padded rows).

    Contract: ids of real rows lie in [0, E) (a -1 slot scores 0); no host sync, graph-capturable.
    """
    T, H = hidden.shape
    K = ids.shape[1]
    E = a.shape[0]
    dev = hidden.device
    check(hidden.dtype in FLOAT_DTYPES and hidden.stride(1) == 1,
          f"hidden: needs a float dtype and unit column stride, got {hidden.dtype} {hidden.stride()}")
    check_tensor("ids", ids, (T, K), ID_DTYPES, dev)
    check_tensor("weights", weights, (T, K), FLOAT_DTYPES, dev)
    check_tensor("budget", budget, (T,), ID_DTYPES, dev)
    check(a.dim() == 2 and a.shape[1] == H and a.stride(1) == 1 and a.device == dev
          and a.dtype in FLOAT_DTYPES, f"a: expected [E, {H}] float with unit column stride on {dev}, "
          f"got {tuple(a.shape)} {a.dtype} {a.stride()} on {a.device}")
    check_tensor("b", b, (E,), FLOAT_DTYPES, dev)
    if out is None:
        out = torch.empty((T, K), dtype=torch.float32, device=dev)
    check_tensor("out", out, (T, K), (torch.float32,), dev)
    if T == 0:
        return out
    block_k = min(triton.next_power_of_2(K), 2)
    block_h = min(triton.next_power_of_2(H), 1024)
    grid = (T, triton.cdiv(K, block_k))
    pdl = use_pdl(dev)
    _base_score_kernel[grid](hidden, ids, weights, budget, a, b, out, H, hidden.stride(0),
                             a.stride(0), K=K, BLOCK_K=block_k, BLOCK_H=block_h, USE_PDL=pdl,
                             num_warps=4, **launch_kwargs(pdl))
    return out

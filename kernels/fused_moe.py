"""Expert-skipping fused MoE: y[t] = sum_k weights[t, k] * down[e] @ (silu(gate[e] @ x_t) * (up[e] @ x_t)),
e = ids[t, k].

Weight layout as transformers 5 stores Qwen3-MoE / OLMoE / Mixtral experts: gate_up [E, 2I, H]
(gate rows first, then up rows), down [E, H, I]. Slots with id -1 (BASE-dropped or padded) contribute
nothing, and an expert that no slot selects is never read from HBM (its weights may even be NaN).
Two paths, both fixed-shape for given (T, K, E, H, I), free of host syncs (graph-capturable) and
deterministic (no atomics):
  decode (T <= DECODE_MAX_T, the default): 2 launches, moe_up (align folded into a persistent
      gate/up GEMM) -> moe_down (down GEMM with the weighted combine fused in);
  blocked (larger T): 4 launches, moe_align -> moe_gemm (gate/up) -> moe_gemm (down) -> moe_combine.
This is base_sglang.core.moe_forward_ref on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from base_sglang.kernels.moe_align import moe_align
from base_sglang.kernels.moe_combine import moe_combine
from base_sglang.kernels.moe_down import down_block_n, moe_down
from base_sglang.kernels.moe_gemm import GemmConfig, moe_gemm
from base_sglang.kernels.moe_up import moe_up
from base_sglang.kernels.utils import (
    FLOAT_DTYPES,
    ID_DTYPES,
    check,
    check_tensor,
    l2_bytes,
    next_pow2,
    num_sms,
)

DECODE_MAX_T = 64  # the decode path computes BLOCK_T >= T rows per combine tile: small batches only


@dataclass(frozen=True)
class DecodeConfig:
    """Tiles of the 2-launch decode path (moe_up, moe_down)."""
    block_m: int = 0  # pairs per block (rows of both GEMMs); 0: resolve_decode picks it
    up_n: int = 16  # gate (and up) rows per item: small items balance the persistent grid
    up_k: int = 256
    up_warps: int = 4
    up_stages: int = 5  # buffers of 24 KB; 6 spills at T=64 (sm_90a); capped to SMEM_BUDGET
    down_n: int = 0  # 0: the smallest tile with at most one program per SM
    down_k: int = 256
    down_warps: int = 4
    down_stages: int = 6  # 5 loads in flight: ~40 KB of weights per SM; capped to SMEM_BUDGET
    programs_per_sm: int = 1  # moe_up's persistent grid
    flatten: bool = True  # one software-pipelined loop across work items (tl.range(flatten=True))


SMEM_BUDGET = 160 * 1024  # shared memory per program for the pipeline buffers (sm_90: 227 KB max)


def resolve_decode(d: DecodeConfig, T: int, H: int, I: int, device: torch.device,  # noqa: E741
                   sms: int | None = None, l2: int | None = None) -> DecodeConfig:
    """Fill in the automatic fields of a DecodeConfig for one call.

    block_m 0: 16, unless one expert's down matrix exceeds half the L2 (Mixtral: 117 MB); then
    next_pow2(T) up to 64, so that no expert spans two blocks: moe_down streams each block's
    weights once per program, and a second block of the same expert would re-read them from HBM
    (for small experts the re-read hits L2). down_n 0: down_block_n(H). Pipeline stages are capped
    so that their buffers (Triton allocates one per stage) fit SMEM_BUDGET. sms, l2: the device's,
    unless given.
    """
    l2 = l2 or l2_bytes(device)
    bm = d.block_m or (16 if H * I * 2 <= l2 // 2 else min(64, max(16, next_pow2(T))))
    bn = d.down_n or down_block_n(H, sms or num_sms(device))
    up_stage = (bm * d.up_k + 2 * d.up_k * d.up_n) * 2  # bytes: hidden rows + gate and up tiles
    down_stage = (bm * d.down_k + d.down_k * bn) * 2  # act rows + down tile
    return replace(d, block_m=bm, down_n=bn,
                   up_stages=max(2, min(d.up_stages, SMEM_BUDGET // up_stage)),
                   down_stages=max(2, min(d.down_stages, SMEM_BUDGET // down_stage)))


@dataclass(frozen=True)
class MoeConfig:
    block_m: int = 16
    up: GemmConfig = GemmConfig(block_n=32, block_k=128, num_warps=4, num_stages=4)
    down: GemmConfig = GemmConfig(block_n=64, block_k=128, num_warps=4, num_stages=4)
    decode: DecodeConfig | None = DecodeConfig()  # None: the blocked path at every T


def default_config(num_tokens: int, num_experts: int, top_k: int,
                   max_experts: int | None = None) -> MoeConfig:
    """Decode heuristic: BLOCK_M covers the mean pairs per active expert (16..64).

    max_experts: an upper bound on the experts actually executed (e.g. the BASE budget M), when the
    caller knows it; fewer experts means more pairs per expert.
    """
    pairs = max(num_tokens * top_k, 1)
    active = min(num_experts, pairs, max_experts or num_experts)
    per_expert = -(-pairs // max(active, 1))
    block_m = min(max(16, 1 << (per_expert - 1).bit_length()), 64)
    return MoeConfig(block_m=block_m)


def fused_moe(
    hidden: torch.Tensor,  # [T, H] bf16/fp16, unit column stride
    ids: torch.Tensor,  # [T, K] int32/int64, -1 = dropped slot
    weights: torch.Tensor,  # [T, K] float combine weights
    gate_up: torch.Tensor,  # [E, 2I, H] contiguous, hidden's dtype
    down: torch.Tensor,  # [E, H, I] contiguous, hidden's dtype
    *,
    config: MoeConfig | None = None,
    max_experts: int | None = None,
) -> torch.Tensor:
    """Routed-expert output [T, H] in hidden's dtype (fp32 accumulation and combine).

    config: tile shapes (default: default_config(T, E, K, max_experts)); max_experts: optional bound
    on the distinct experts the ids select (the BASE budget), used only to pick BLOCK_M.
    """
    T, H = hidden.shape
    E, two_i, _ = gate_up.shape
    I = two_i // 2  # noqa: E741
    K = ids.shape[1]
    dev = hidden.device
    check(hidden.dtype in (torch.bfloat16, torch.float16) and hidden.stride(1) == 1,
          f"hidden: needs bf16/fp16 with unit column stride, got {hidden.dtype} {hidden.stride()}")
    check_tensor("gate_up", gate_up, (E, 2 * I, H), (hidden.dtype,), dev)
    check_tensor("down", down, (E, H, I), (hidden.dtype,), dev)
    check_tensor("ids", ids, (T, K), ID_DTYPES, dev, contiguous=False)
    check_tensor("weights", weights, (T, K), FLOAT_DTYPES, dev, contiguous=False)
    ids = ids.contiguous()
    weights = weights.contiguous()
    cfg = config or default_config(T, E, K, max_experts)
    out = torch.empty((T, H), dtype=hidden.dtype, device=dev)
    if cfg.decode is not None and T <= DECODE_MAX_T:
        d = resolve_decode(cfg.decode, T, H, I, dev)
        act = torch.empty((T * K, I), dtype=hidden.dtype, device=dev)  # [P, I]
        blocks = moe_up(hidden, ids, weights, gate_up, act, block_m=d.block_m, block_n=d.up_n,
                        block_k=d.up_k, num_warps=d.up_warps, num_stages=d.up_stages,
                        programs_per_sm=d.programs_per_sm, flatten=d.flatten)
        return moe_down(act, down, blocks, out, block_n=d.down_n, block_k=d.down_k,
                        num_warps=d.down_warps, num_stages=d.down_stages, flatten=d.flatten)
    blocks = moe_align(ids, E, cfg.block_m)
    act = torch.empty((T * K, I), dtype=hidden.dtype, device=dev)  # [P, I]
    moe_gemm(hidden, gate_up, act, blocks, a_div=K, gated=True, config=cfg.up)
    pair_out = torch.empty((T * K, H), dtype=torch.float32, device=dev)  # [P, H]
    moe_gemm(act, down, pair_out, blocks, a_div=1, gated=False, config=cfg.down)
    return moe_combine(pair_out, ids, weights, E, out)

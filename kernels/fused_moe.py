"""Expert-skipping fused MoE for decode: moe_align -> gate/up GEMM with SiLU*up -> down GEMM -> combine.

    y[t] = sum_k weights[t, k] * down[e] @ (silu(gate[e] @ x_t) * (up[e] @ x_t)),  e = ids[t, k]
Weight layout as transformers 5 stores Qwen3-MoE / OLMoE / Mixtral experts: gate_up [E, 2I, H]
(gate rows first, then up rows), down [E, H, I]. Slots with id -1 (BASE-dropped or padded) contribute
nothing, and an expert that no slot selects is never read from HBM (its weights may even be NaN).
Fixed shapes for given (T, K, E, H, I), no host sync: graph-capturable, deterministic. Launches:
    grouped     align -> up GEMM -> down GEMM -> combine      (4)
    pair_major  up GEMM -> down GEMM -> combine               (3: every slot its own one-row
                                                                 block, straight from ids)
default_config picks pair-major for T <= PAIR_MAJOR_MAX_T (at T = 1 a top-k router's slots are
distinct experts, so each kept expert is still read once). This is base_sglang.core.moe_forward_ref
on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from base_sglang.kernels.moe_align import moe_align
from base_sglang.kernels.moe_combine import moe_combine
from base_sglang.kernels.moe_gemm import GemmConfig, moe_gemm
from base_sglang.kernels.utils import FLOAT_DTYPES, ID_DTYPES, check, check_tensor

# pair-major up to this batch: from T = 2 on, an expert shared by two tokens would be read twice
PAIR_MAJOR_MAX_T = 1


@dataclass(frozen=True)
class MoeConfig:
    block_m: int = 16
    up: GemmConfig = GemmConfig(block_n=32, block_k=128, num_warps=4, num_stages=4)
    down: GemmConfig = GemmConfig(block_n=64, block_k=128, num_warps=4, num_stages=4)
    pair_major: bool = False  # each slot its own one-row block: no align launch


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
    return MoeConfig(block_m=block_m, pair_major=num_tokens <= PAIR_MAJOR_MAX_T)


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
    blocks = None if cfg.pair_major else moe_align(ids, E, cfg.block_m)
    act = torch.empty((T * K, I), dtype=hidden.dtype, device=dev)  # [P, I]
    moe_gemm(hidden, gate_up, act, blocks, a_div=K, gated=True, config=cfg.up, ids=ids)
    pair_out = torch.empty((T * K, H), dtype=torch.float32, device=dev)  # [P, H]
    moe_gemm(act, down, pair_out, blocks, a_div=1, gated=False, config=cfg.down, ids=ids)
    out = torch.empty((T, H), dtype=hidden.dtype, device=dev)
    return moe_combine(pair_out, ids, weights, E, out)

"""Expert-skipping fused MoE for decode: moe_align -> gate/up GEMM with SiLU*up -> down GEMM -> combine.

    y[t] = sum_k weights[t, k] * down[e] @ (silu(gate[e] @ x_t) * (up[e] @ x_t)),  e = ids[t, k]
Weight layout as transformers 5 stores Qwen3-MoE / OLMoE / Mixtral experts: gate_up [E, 2I, H]
(gate rows first, then up rows), down [E, H, I]. Slots with id -1 (BASE-dropped or padded) contribute
nothing, and an expert that no slot selects is never read from HBM (its weights may even be NaN).
Fixed shapes for given (T, K, E, H, I), no host sync: graph-capturable, deterministic. Launches:
    grouped     align -> up GEMM -> down GEMM -> combine      (4)
    pair_major  up GEMM -> down GEMM -> combine               (3: every slot its own one-row
                                                                 block, straight from ids)
    one_launch  align, up, down and combine in one persistent launch (1: moe_one.py; the up
                tiles' num_warps / num_stages serve the whole launch)
default_config takes the tuned config of the GPU and shape (moe_configs) or a heuristic; pair-major
wins at T = 1 (a top-k router's slots are distinct experts: each kept expert is still read once)
and at T = 2 with many experts per slot. This is base_sglang.core.moe_forward_ref
on the GPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from base_sglang.kernels.moe_align import moe_align
from base_sglang.kernels.moe_combine import moe_combine
from base_sglang.kernels.moe_configs import gpu_file, load_table, shape_key, tuned_row
from base_sglang.kernels.moe_gemm import GemmConfig, moe_gemm
from base_sglang.kernels.moe_one import check_options, moe_one
from base_sglang.kernels.utils import check, check_moe_inputs, check_tensor, num_sms


@dataclass(frozen=True)
class MoeConfig:
    block_m: int = 16
    up: GemmConfig = GemmConfig(block_n=32, block_k=128, num_warps=4, num_stages=4)
    down: GemmConfig = GemmConfig(block_n=64, block_k=128, num_warps=4, num_stages=4)
    pair_major: bool = False  # each slot its own one-row block: no align launch
    one_launch: bool = False  # the whole layer in one persistent launch (moe_one)
    ctas_per_sm: int = 1  # one_launch: programs per SM
    maxnreg: int = 0  # one_launch: registers per thread the compile may use (0 = ptxas's choice)
    up_cols: int = 0  # one_launch: columns of I per up unit (0 = up.block_n)
    tma: int = 0  # one_launch: weight tiles by bulk tensor copies (TMA): 1 all, 2 down only
    idle_low: int = 0  # one_launch: 1 = with fewer units than programs, the lowest ids idle
    pair_order: int = 0  # one_launch: 1 = on a 2-per-SM grid the programs alone on their SM walk first

    @staticmethod
    def from_dict(d: dict) -> MoeConfig:
        cfg = MoeConfig(block_m=int(d["block_m"]), pair_major=bool(d["pair_major"]),
                        up=GemmConfig(**d["up"]), down=GemmConfig(**d["down"]),
                        one_launch=bool(d.get("one_launch", False)),
                        ctas_per_sm=int(d.get("ctas_per_sm", 1)),
                        maxnreg=int(d.get("maxnreg", 0)), up_cols=int(d.get("up_cols", 0)),
                        tma=int(d.get("tma", 0)), idle_low=int(d.get("idle_low", 0)),
                        pair_order=int(d.get("pair_order", 0)))
        check(cfg.idle_low in (0, 1), f"idle_low: 0 or 1, got {cfg.idle_low}")
        check(cfg.pair_order in (0, 1) and not (cfg.pair_order and cfg.idle_low),
              f"pair_order: 0 or 1, and not with idle_low, got {cfg.pair_order} (idle_low {cfg.idle_low})")
        check_options(cfg.up.block_n, cfg.up_cols, cfg.maxnreg, cfg.tma)  # at load, not at first call
        return cfg


LARGE_EXPERT = 4096  # intermediate size from which an expert's weights stream best in BLOCK_K 256
ONE_MAX_PAIRS = 256  # one_launch runs up to T*K pairs (tuned to T = 32 at K = 8); above, grouped


def pair_major_wins(num_tokens: int, num_experts: int, top_k: int) -> bool:
    """Measured on the H200 (benchmarks/results/kernels_h200_moe): pair-major is faster at T = 1
    for every shape, and at T = 2 where experts are many per slot (Qwen3 E=16K, OLMoE E=8K: 18-24%
    faster); Mixtral (E = 4K) shares experts at T = 2 and loses 4%."""
    return num_tokens == 1 or (num_tokens == 2 and num_experts >= 8 * top_k)


@functools.lru_cache(maxsize=4096)  # called per layer per step: the lookup runs once per shape
def default_config(num_tokens: int, num_experts: int, top_k: int, max_experts: int | None = None,
                   *, hidden: int | None = None, inter: int | None = None,
                   gpu: str | None = None) -> MoeConfig:
    """The tuned config of this GPU and shape when moe_configs has one, else a heuristic.

    max_experts: an upper bound on the experts actually executed (e.g. the BASE budget M), when the
    caller knows it; below E it selects the "budget" rows (fewer experts, more pairs each).
    Heuristic: pair-major where pair_major_wins, else BLOCK_M covers the mean pairs per active
    expert (16..64); tiles from the sweep's most common winners.
    """
    budgeted = max_experts is not None and max_experts < num_experts
    if gpu and hidden and inter:
        row = tuned_row(load_table(str(gpu_file(gpu))),
                        shape_key(num_experts, hidden, inter, top_k), num_tokens, budgeted)
        if row is not None:
            return MoeConfig.from_dict(row)
    large = (inter or 0) >= LARGE_EXPERT
    if pair_major_wins(num_tokens, num_experts, top_k):
        if large:
            return MoeConfig(pair_major=True, up=GemmConfig(16, 128, 4, 4),
                             down=GemmConfig(64, 128, 4, 4))
        return MoeConfig(pair_major=True, up=GemmConfig(32, 64, 4, 5),
                         down=GemmConfig(128, 128, 8, 4, n_fast=True))
    pairs = max(num_tokens * top_k, 1)
    active = min(num_experts, pairs, max_experts or num_experts)
    per_expert = -(-pairs // max(active, 1))
    block_m = min(max(16, 1 << (per_expert - 1).bit_length()), 64)
    if large:
        return MoeConfig(block_m=block_m, up=GemmConfig(32, 256, 4, 3), down=GemmConfig(64, 256, 4, 3))
    if num_tokens >= 32:
        return MoeConfig(block_m=block_m, up=GemmConfig(32, 256, 4, 3))
    return MoeConfig(block_m=block_m)


@functools.lru_cache(maxsize=8)
def device_name(device: torch.device) -> str | None:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def fused_moe(
    hidden: torch.Tensor,  # [T, H] bf16/fp16, unit column stride
    ids: torch.Tensor,  # [T, K] int32/int64, -1 = dropped slot
    weights: torch.Tensor,  # [T, K] float combine weights
    gate_up: torch.Tensor,  # [E, 2I, H] contiguous, hidden's dtype
    down: torch.Tensor,  # [E, H, I] contiguous, hidden's dtype
    *,
    config: MoeConfig | None = None,
    max_experts: int | None = None,
    out: torch.Tensor | None = None,  # [T, H] hidden's dtype, unit column stride; may be hidden
) -> torch.Tensor:
    """Routed-expert output [T, H] in hidden's dtype (fp32 accumulation and combine).

    config: tile shapes (default: default_config(T, E, K, max_experts)); max_experts: optional bound
    on the distinct experts the ids select (the BASE budget), used only to pick BLOCK_M. out: where
    the result goes (returned); out = hidden is the in-place call. The grouped path's combine writes
    it after the up GEMM has read hidden (a launch boundary), so no copy; the one-launch path reads
    and writes within one kernel, so it writes a fresh tensor and copies it into out.
    """
    T, H, E, I, K = check_moe_inputs(hidden, ids, weights, gate_up, down)  # noqa: E741
    dev = hidden.device
    ids = ids.contiguous()
    weights = weights.contiguous()
    if out is not None:
        check_tensor("out", out, (T, H), (hidden.dtype,), dev, contiguous=False)
        check(out.stride(1) == 1, f"out: needs unit column stride, got strides {out.stride()}")
    cfg = config or default_config(T, E, K, max_experts, hidden=H, inter=I, gpu=device_name(dev))
    if cfg.one_launch and T * K <= ONE_MAX_PAIRS:  # (a row of T <= 32 may be looked up above it)
        y = moe_one(hidden, ids, weights, gate_up, down, block_m=cfg.block_m,
                       up=(cfg.up.block_n, cfg.up.block_k),
                       down_tiles=(cfg.down.block_n, cfg.down.block_k), num_warps=cfg.up.num_warps,
                       num_stages=cfg.up.num_stages, maxnreg=cfg.maxnreg or None,
                       up_cols=cfg.up_cols or None, tma=cfg.tma, idle_low=bool(cfg.idle_low),
                       pair_order=bool(cfg.pair_order),
                       programs=cfg.ctas_per_sm * num_sms(dev) if dev.type == "cuda" else None)
        return y if out is None else out.copy_(y)
    blocks = None if cfg.pair_major else moe_align(ids, E, cfg.block_m)
    act = torch.empty((T * K, I), dtype=hidden.dtype, device=dev)  # [P, I]
    moe_gemm(hidden, gate_up, act, blocks, a_div=K, gated=True, config=cfg.up, ids=ids)
    pair_out = torch.empty((T * K, H), dtype=torch.float32, device=dev)  # [P, H]
    moe_gemm(act, down, pair_out, blocks, a_div=1, gated=False, config=cfg.down, ids=ids)
    if out is None:
        out = torch.empty((T, H), dtype=hidden.dtype, device=dev)
    return moe_combine(pair_out, ids, weights, E, out)

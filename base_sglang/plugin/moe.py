"""SGLang's fused_experts_impl in BASE decode steps: our expert-skipping MoE where the call is plain.

In a BASE decode step the routed ids carry -1 for dropped slots. SGLang's Triton MoE then needs
filter_expert=True (0.5.17 skips -1 blocks only with it). With BASE_MOE=auto (the default), a plain
call of at most OURS_MAX_TOKENS rows on a GPU with a tuned budget row for its shape
(kernels/configs/<GPU>.json, at that row count) runs base_sglang.kernels.fused_moe instead, with
those tiles (pair-major at T <= 2, the one-launch layer at T = 4..32). Measured end to end in
SGLang 0.5.17 decode on the H200 (BENCHMARKS.md, seventh session; Qwen3-30B-A3B shape, B = 1 / 8 /
16, budgets dense / 16 / 4): 3-12 % less time per step than SGLang's Triton MoE in every cell. Above
16 rows SGLang's kernel is as fast or faster for BASE-selected ids, and on a GPU or shape nobody
tuned ours is unmeasured, so those calls keep SGLang's kernel. Plain = bf16/fp16 activations on
CUDA, gate/up weights [E, 2I, H] (gate rows first, as SGLang's silu_and_mul reads them) and down
[E, H, I], both contiguous in the activations' dtype; activation silu, gated; and every other
argument of fused_experts_impl at its default (no bias, quantisation, scales, router weight on
input, no_combine, routed scaling other than 1, clamps, ...). An argument this module does not know
(a newer SGLang) that is not at its default also sends the call to SGLang's kernel: nothing is
assumed about arguments we have not read. BASE_MOE=sglang always runs SGLang's kernel.
"""

from __future__ import annotations

import functools
import inspect

import torch

OURS_MAX_TOKENS = 16  # BASE_MOE=auto: rows up to which our fused_moe runs the call
# arguments read here; every other one must be at its default
HANDLED = ("hidden_states", "w1", "w2", "topk_weights", "topk_ids", "inplace", "filter_expert",
           "activation", "is_gated", "routed_scaling_factor")


@functools.cache
def signature() -> inspect.Signature:
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe

    return inspect.signature(fused_moe.fused_experts_impl)  # follows the hook's __wrapped__


def _at_default(value, default) -> bool:
    if default is inspect.Parameter.empty:
        return False
    if default is None or isinstance(value, torch.Tensor):
        return value is default
    return type(value) is type(default) and value == default


def why_not_ours(args: dict, sig: inspect.Signature) -> str | None:
    """None when fused_moe computes this call exactly; else the first reason it does not."""
    for name, p in sig.parameters.items():
        if name not in HANDLED and name in args and not _at_default(args[name], p.default):
            return f"{name}={args[name]!r:.40}"
    if args.get("activation", "silu") != "silu" or not args.get("is_gated", True):
        return f"activation {args.get('activation')!r}, gated {args.get('is_gated', True)}"
    if args.get("routed_scaling_factor") not in (None, 1.0):
        return f"routed_scaling_factor={args['routed_scaling_factor']}"
    x, w1, w2 = args["hidden_states"], args["w1"], args["w2"]
    ids, w = args["topk_ids"], args["topk_weights"]
    if x.dim() == 2 and x.shape[0] > OURS_MAX_TOKENS:
        return f"more than {OURS_MAX_TOKENS} rows"  # one log line for every larger batch
    if x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16) or x.stride(1) != 1:
        return f"hidden_states {x.dtype} {tuple(x.shape)}"
    if not (x.is_cuda or _interpreter()):
        return f"hidden_states on {x.device}"
    E = w1.shape[0]
    H = x.shape[1]
    if (w1.dim() != 3 or w2.dim() != 3 or w1.dtype != x.dtype or w2.dtype != x.dtype
            or w1.shape[2] != H or w1.shape[1] % 2 or tuple(w2.shape) != (E, H, w1.shape[1] // 2)
            or not (w1.is_contiguous() and w2.is_contiguous())):
        return f"weights {tuple(w1.shape)} {tuple(w2.shape)} {w1.dtype}"
    if (ids.dim() != 2 or ids.shape[0] != x.shape[0] or ids.dtype not in (torch.int32, torch.int64)
            or tuple(w.shape) != tuple(ids.shape) or not w.is_floating_point()):
        return f"topk {tuple(ids.shape)} {ids.dtype} / {tuple(w.shape)} {w.dtype}"
    if x.is_cuda:
        from base_sglang.kernels.fused_moe import device_name

        return untuned(device_name(x.device), E, H, w2.shape[2], ids.shape[1], x.shape[0])
    return None  # the Triton interpreter (tests): no GPU to be tuned for


def untuned(gpu: str | None, E: int, H: int, inter: int, K: int, T: int) -> str | None:
    """None when kernels/configs has a budget row of this GPU and shape for T rows (what run_ours
    launches, measured faster there); else why not."""
    from base_sglang.kernels.moe_configs import gpu_file, load_table, shape_key, tuned_row

    key = shape_key(E, H, inter, K)
    table = load_table(str(gpu_file(gpu))) if gpu else {}
    if not table.get(key, {}).get("budget"):  # one log line per GPU and shape, not per T
        return f"no tuned fused_moe rows for {gpu} {key}"
    if tuned_row(table, key, T, budgeted=True) is None:
        return f"no tuned fused_moe row for {gpu} {key} at T={T}"
    return None


def _interpreter() -> bool:
    from base_sglang.kernels.utils import is_interpreter

    return is_interpreter()


def run_ours(args: dict) -> torch.Tensor:
    """fused_moe on a plain call, with the tiles tuned for BASE-selected ids (max_experts < E);
    inplace writes the result into hidden_states, as SGLang does."""
    from base_sglang.kernels import fused_moe

    x, w1 = args["hidden_states"], args["w1"]
    y = fused_moe(x, args["topk_ids"], args["topk_weights"], w1, args["w2"],
                  max_experts=w1.shape[0] - 1)
    if args.get("inplace", False):
        return x.copy_(y)
    return y

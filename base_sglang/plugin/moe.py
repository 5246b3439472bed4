"""SGLang's fused_experts_impl in BASE decode steps: our expert-skipping MoE where the call is plain.

In a BASE decode step the routed ids carry -1 for dropped slots. SGLang's Triton MoE then needs
filter_expert=True (0.5.17 skips -1 blocks only with it). With BASE_MOE=auto (the default), a plain
call of at most BASE_MOE_MAX_ROWS rows (default OURS_MAX_TOKENS = 64) on a GPU with a tuned budget
row for its shape (kernels/configs/<GPU>.json, at that row count) runs base_sglang.kernels.fused_moe
instead, with those tiles (pair-major at T <= 2, the one-launch layer from T = 4 to 63 / 31 for the
Qwen3 / OLMoE shapes with a budget, the sort align and grouped GEMMs above). Measured end to end in
SGLang 0.5.17 decode (BENCHMARKS.md; Qwen3-30B-A3B shape): 3-12 % less time per step than SGLang's
Triton MoE at B = 1 / 8 / 16 on the H200 (seventh session); at B = 32 / 64 with budgets 16 / 8,
9-15 % less on an H100 with the H200's tiles (two calls, twenty-second session), dense steps within
1.5 %. At 128 rows ours takes 8.5-15.5 % less with a budget but 4 % slower dense (a CUDA graph
serves both), so the default stops at 64. On a GPU or shape nobody tuned ours is unmeasured, so
those calls keep SGLang's kernel. Plain = bf16/fp16 activations on CUDA, gate/up weights [E, 2I, H]
(gate rows first, as SGLang's silu_and_mul reads them) and down [E, H, I], both contiguous in the
activations' dtype; activation silu, gated; and every other argument of fused_experts_impl at its
default (no bias, quantisation, scales, router weight on input, no_combine, routed scaling other
than 1, clamps, ...). An argument this module does not know (a newer SGLang) that is not at its
default also sends the call to SGLang's kernel: nothing is assumed about arguments we have not read.
BASE_MOE=sglang always runs SGLang's kernel.
"""

from __future__ import annotations

import functools
import inspect

import torch

OURS_MAX_TOKENS = 64  # default of BASE_MOE_MAX_ROWS: rows up to which BASE_MOE=auto runs ours
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


def why_not_ours(args: dict, sig: inspect.Signature, max_rows: int = OURS_MAX_TOKENS) -> str | None:
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
    if x.dim() == 2 and x.shape[0] > max_rows:
        return f"more than {max_rows} rows"  # one log line for every larger batch
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
    inplace writes the result into hidden_states, as SGLang does (the grouped path's combine writes
    it directly, the one-launch path copies)."""
    from base_sglang.kernels import fused_moe

    x, w1 = args["hidden_states"], args["w1"]
    return fused_moe(x, args["topk_ids"], args["topk_weights"], w1, args["w2"],
                     max_experts=w1.shape[0] - 1, out=x if args.get("inplace", False) else None)

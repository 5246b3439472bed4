"""Triton kernels for BASE (installed as base_sglang.kernels).

    base_score           predicted removal cost of each routed (token, expert) pair
    base_select          batch score, top-M kept set, backfill and combine weights (one launch)
    base_fused_select    base_score + base_select in one cooperative launch (a grid barrier)
    base_select_experts  base_sglang.core.select_experts' signature: base_fused_select or the two
                         launches, by shape (selection_kernel)
    moe_align            (token, expert) pairs grouped by expert into GEMM blocks, kept experts only
    moe_gemm             grouped expert GEMM over those blocks (gate/up + SiLU*up, or down)
    moe_combine          weighted sum of each token's pair outputs (deterministic)
    fused_moe            moe_align + moe_gemm x2 + moe_combine: the expert-skipping bf16 MoE

Triton is imported on first use of a name, so `import base_sglang.kernels` works without it.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "base_score": "base_score",
    "base_select": "base_select",
    "base_fused_select": "base_fused",
    "base_select_experts": "select_experts",
    "selection_kernel": "select_experts",
    "moe_align": "moe_align",
    "moe_gemm": "moe_gemm",
    "moe_combine": "moe_combine",
    "fused_moe": "fused_moe",
}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # NOTE: import every module first, then bind the names: importing a submodule binds the
    # package attribute of the same name to the module, which must not shadow the function.
    modules = {mod: importlib.import_module(f".{mod}", __name__) for mod in set(_WHERE.values())}
    for fn, mod in _WHERE.items():
        globals()[fn] = getattr(modules[mod], fn)
    return globals()[name]

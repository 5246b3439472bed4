"""Triton kernels for BASE (installed as base_sglang.kernels).

    base_score           predicted removal cost of each routed (token, expert) pair
    base_select          batch score, top-M kept set, backfill and combine weights (one launch)
    base_fused_select    base_score + base_select in one cooperative launch (a grid barrier)
    base_select_experts  base_sglang.core.select_experts' signature: base_fused_select or the two
                         launches, by shape (selection_kernel)
    base_route_select    the router's softmax top-k + BASE in one launch, from a folded router GEMM
    base_route_split     the same in two launches (each program routes its own rows once)
    route_select_experts its Selection-returning front (core.routing on the CPU)
    moe_align            (token, expert) pairs grouped by expert into GEMM blocks, kept experts only
    moe_gemm             grouped expert GEMM over those blocks (gate/up + SiLU*up, or down)
    moe_combine          weighted sum of each token's pair outputs (deterministic)
    fused_moe            moe_align + moe_gemm x2 + moe_combine: the expert-skipping bf16 MoE
    moe_one              the same layer in one persistent launch (fused_moe's one_launch path)

Triton is imported on first use of a name, so `import base_sglang.kernels` works without it.
"""

from __future__ import annotations

import importlib
import sys
import types

_WHERE = {
    "base_score": "base_score",
    "base_select": "base_select",
    "base_fused_select": "base_fused",
    "base_select_experts": "select_experts",
    "base_route_select": "base_route",
    "route_select_experts": "select_experts",
    "route_wins": "select_experts",
    "route_mode": "select_experts",
    "base_route_split": "base_route_split",
    "selection_kernel": "select_experts",
    "moe_align": "moe_align",
    "moe_gemm": "moe_gemm",
    "moe_combine": "moe_combine",
    "fused_moe": "fused_moe",
    "moe_one": "moe_one",
}
__all__ = list(_WHERE)
# values of the benchmark overrides BASE_ROUTE and BASE_SELECT_KERNEL (select_experts.py), here so
# that the plugin can check them at startup without importing Triton
ROUTE_MODES = ("auto", "fold", "split", "unfold")
SELECT_KERNELS = ("fused", "two")


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    modules = {mod: importlib.import_module(f".{mod}", __name__) for mod in set(_WHERE.values())}
    for fn, mod in _WHERE.items():
        globals()[fn] = getattr(modules[mod], fn)
    return globals()[name]


class _Package(types.ModuleType):
    """Importing a submodule sets the package attribute of its name to the module (after the
    submodule ran, so nothing inside it can prevent that): base_score, base_select, moe_align,
    moe_combine, moe_gemm, moe_one and fused_moe would then shadow the functions of the same name, and
    `from base_sglang.kernels import fused_moe` would depend on import order. Reading such an
    attribute returns the function; the modules stay importable by their dotted names."""

    def __getattribute__(self, name: str):
        value = super().__getattribute__(name)
        if isinstance(value, types.ModuleType) and _WHERE.get(name) == name:
            return getattr(value, name)
        return value


sys.modules[__name__].__class__ = _Package

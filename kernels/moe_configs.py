"""Tuned fused_moe configs per GPU and MoE shape (what benchmarks/gpu/sweep_moe.py measured fastest).

    configs/<GPU name, spaces as _>.json   written by benchmarks/gpu/tuned_configs.py
      {"provenance": {...}, "shapes": {"E=128,H=2048,I=768,K=8": {"dense": {"1": cfg, "8": cfg, ...},
                                                                   "budget": {...}}}}
    cfg = MoeConfig as a dict (block_m, pair_major, up / down GemmConfig fields)
    or {"provenance": {...}, "same_as": "<another GPU name>"}: that GPU's rows, used as they are
      (written by hand only after they were measured on this GPU; the provenance names the runs)
    either may add "route_split_min_t": N, the fewest rows at which the two-launch route-select runs
      by default on this GPU (select_experts.route_mode; never borrowed through same_as: measured
      per GPU, by hand, provenance["route_split_min_t_runs"] naming the runs)
"dense" rows were tuned on top-k routing, "budget" rows on BASE-selected ids (fewer experts, more
pairs each). A lookup takes the row of the largest tuned T <= T. A pair-major row is used only at
its own T (it reads a shared expert once per token, so it is not extrapolated to larger batches;
the next grouped row is used instead). Below the smallest or above the largest tuned T, and for a
shape or GPU without a file, there is no tuned config (fused_moe.default_config's heuristic).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

CONFIG_DIR = Path(__file__).parent / "configs"


def shape_key(num_experts: int, hidden: int, inter: int, top_k: int) -> str:
    return f"E={num_experts},H={hidden},I={inter},K={top_k}"


def gpu_file(gpu_name: str) -> Path:
    return CONFIG_DIR / (gpu_name.replace(" ", "_") + ".json")


@functools.lru_cache(maxsize=16)
def load_table(path: str) -> dict:
    """{shape key: {"dense"|"budget": {T: config dict}}}; {} when the file does not exist."""
    p = Path(path)
    if not p.is_file():
        return {}
    doc = json.loads(p.read_text())
    if "same_as" in doc:  # one level: a borrowed table never points further
        p = gpu_file(doc["same_as"])
        doc = json.loads(p.read_text())
        if "same_as" in doc:
            raise ValueError(f"{path}: same_as names {p.name}, which borrows its rows too")
    shapes = doc["shapes"]
    return {key: {kind: {int(t): cfg for t, cfg in rows.items()} for kind, rows in kinds.items()}
            for key, kinds in shapes.items()}


@functools.lru_cache(maxsize=16)
def route_split_min_t(gpu_name: str | None) -> int | None:
    """This GPU's own "route_split_min_t" (its file, not a same_as table), or None."""
    if not gpu_name or not gpu_file(gpu_name).is_file():
        return None
    doc = json.loads(gpu_file(gpu_name).read_text())
    value = doc.get("route_split_min_t")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{gpu_file(gpu_name).name}: route_split_min_t must be an integer >= 1, "
                         f"got {value!r}")
    return value


def tuned_row(table: dict, key: str, num_tokens: int, budgeted: bool) -> dict | None:
    """The config dict for a batch of num_tokens rows (see the module docstring), or None."""
    rows = table.get(key, {}).get("budget" if budgeted else "dense") or {}
    ts = sorted(rows)
    if not ts or num_tokens < ts[0] or num_tokens > ts[-1]:
        return None
    at = max(t for t in ts if t <= num_tokens)
    if rows[at].get("pair_major") and at != num_tokens:
        grouped = [t for t in ts if t > num_tokens and not rows[t].get("pair_major")]
        return rows[grouped[0]] if grouped else None
    return rows[at]

"""Write kernels/configs/<GPU>.json (the tuned fused_moe configs) from a sweep_moe.py result.

    python benchmarks/gpu/tuned_configs.py SWEEP_JSON [SWEEP_JSON ...] [--trace TRACE_JSON ...]
        [--out kernels/configs]
Several sweeps of one GPU merge (a later file's cell replaces an earlier one's, or with
--keep-faster the faster of them). Each cell's winner (the tile search's best, or the faster structure where no search ran) becomes the
row of its shape, routing kind (dense top-k, or BASE-selected: "budget") and T. The provenance
(GPU, commit, torch/triton, the sweep file) is copied in. kernels/moe_configs.py reads the file.
A route_split_min_t in the file being replaced (end-to-end runs set it, not sweeps) is kept.
--replace SWEEP_JSON: sweeps whose cells replace the merged rows whatever their time (a tile search
judged by an A/B against the shipped rows on one machine, not by times of earlier machines).
--trace: trace_moe_one.py results (variants of the shipped one-launch rows, timed at BASE budgets
M): a variant replaces its "budget" row where it was timed in at least two of the files (every file
when only one is given), is never more than 1 % slower than "shipped" and at least 2 % faster in the
median, over every (file, M) that timed both (ADOPT_*); the row records the variant and those
ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kernel_common import SHAPES  # noqa: E402
from sweep_moe import structures  # noqa: E402
from trace_moe_one import parse_variant  # noqa: E402

from base_sglang.kernels.fused_moe import MoeConfig, default_config  # noqa: E402
from base_sglang.kernels.moe_configs import shape_key  # noqa: E402


def rows_from_sweep(sweep: dict, keep_faster: bool = False) -> dict:
    shapes: dict = {}
    for c in sweep["cells"]:
        s = SHAPES[c["shape"]]
        E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
        kind = "dense" if c["routing"] == "dense" else "budget"
        if "tuned" in c:
            cfg = MoeConfig.from_dict(c["tuned"])  # validates the fields
            us = c["tuned_us"]
        else:  # the structure search alone: the default config of the faster structure
            cfg = dataclasses.replace(default_config(c["T"], E, K),
                                      pair_major=c["best_structure"] == "pair")
            us = c["structures"][c["best_structure"]]
        if "tuned" in c and min(c["structures"].values()) < us:  # a forced search that lost
            best = c["best_structure"]
            cfg = structures(default_config(c["T"], E, K), c["T"])[best]
            us = c["structures"][best]
        row = {**dataclasses.asdict(cfg), "us": us, "floor_us": c["floor_us"]}
        rows = shapes.setdefault(shape_key(E, H, I, K), {}).setdefault(kind, {})
        if not keep_faster or str(c["T"]) not in rows or us < rows[str(c["T"])]["us"]:
            rows[str(c["T"])] = row
    return shapes


ADOPT_MIN, ADOPT_MEDIAN = 0.99, 1.02  # shipped / variant time: never below, median at least


def apply_traces(shapes: dict, traces: list[dict]) -> list[str]:
    """Adopt trace variants into the budget rows of `shapes` (in place); returns what changed.
    A file's ratios (its shipped / its variant) count against the row its "shipped" ran (the cell's
    recorded config; without one, the sweep row): the rule runs once per generation, so a variant
    timed on top of an adopted one (u=48, then t=2 over it) is judged against what it ran over."""
    found: dict[tuple, list] = {}  # (shape, T) -> [(file, {variant: cell}) per M]
    for i, tr in enumerate(traces):
        cells: dict[tuple, dict[str, dict]] = {}
        for c in tr["cells"]:
            if "us" in c and c.get("shipped_one_launch"):
                cells.setdefault((c["shape"], c["T"], c["M"]), {})[c["variant"]] = c
        for (shape, T, _), by in cells.items():
            if "shipped" in by:
                found.setdefault((shape, T), []).append((i, by))
    changed = []
    for (shape, T), entries in sorted(found.items()):
        s = SHAPES[shape]
        rows = shapes.get(shape_key(s["E"], s["H"], s["I"], s["K"]), {}).get("budget", {})
        row = rows.get(str(T))
        if row is None or not row.get("one_launch"):
            continue
        base = cfg = MoeConfig.from_dict(row)
        chain = []
        for _ in traces:  # at most one adoption per file
            ratios: dict[str, list[float]] = {}
            files: dict[str, set[int]] = {}
            cfgs = {}
            for i, by in entries:
                ran = MoeConfig.from_dict(by["shipped"]["config"]) if "config" in by["shipped"] else base
                if ran != cfg:
                    continue
                for v, c in by.items():
                    if v != "shipped":
                        ratios.setdefault(v, []).append(by["shipped"]["us"] / c["us"])
                        files.setdefault(v, set()).add(i)
                        cfgs[v] = (MoeConfig.from_dict(c["config"]) if "config" in c
                                   else parse_variant(v, cfg))
            good = {v: r for v, r in ratios.items() if len(files[v]) >= min(2, len(traces))
                    and min(r) >= ADOPT_MIN and statistics.median(r) >= ADOPT_MEDIAN}
            if not good:
                break
            v = max(good, key=lambda k: statistics.median(good[k]))
            if cfgs[v] == cfg:
                break
            cfg = cfgs[v]
            chain.append((v, good[v]))
            changed.append(f"{shape} T={T}: {v} (shipped / variant {min(good[v]):.3f}-{max(good[v]):.3f})")
        if chain:
            rows[str(T)] = {**dataclasses.asdict(cfg), "us": row["us"], "floor_us": row["floor_us"],
                            "trace_variant": " > ".join(v for v, _ in chain),
                            "trace_ratios": [round(x, 3) for x in chain[-1][1]]}
    return changed


def keep_route_rule(table: dict, path: str) -> None:
    """The file being replaced may carry this GPU's route_split_min_t (measured by end-to-end runs,
    not by a tile sweep; kernels/moe_configs.py): keep it and the provenance entries naming its runs."""
    if not os.path.isfile(path):
        return
    with open(path) as f:
        old = json.load(f)
    if "route_split_min_t" in old:
        table["route_split_min_t"] = old["route_split_min_t"]
        table["provenance"]["route_split_min_t_runs"] = old["provenance"].get("route_split_min_t_runs", [])
        print(f"kept route_split_min_t {old['route_split_min_t']} from the file this one replaces")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep", nargs="+")
    ap.add_argument("--keep-faster", action="store_true",
                    help="where sweeps share a cell keep the faster row (default: the later file's)")
    ap.add_argument("--replace", nargs="*", default=[],
                    help="sweeps whose cells replace the merged rows (see above)")
    ap.add_argument("--trace", nargs="*", default=[], help="trace_moe_one.json files (see above)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "kernels",
                                                  "configs"))
    args = ap.parse_args()
    sweeps = [json.load(open(p)) for p in args.sweep]
    replace = [json.load(open(p)) for p in args.replace]
    gpus = {sw.get("gpu") for sw in sweeps + replace}
    if any(not sw.get("cells") for sw in sweeps + replace) or len(gpus) != 1:
        print(f"{args.sweep + args.replace}: every sweep needs cells, all of one GPU "
              f"(got {sorted(map(str, gpus))})", file=sys.stderr)
        return 2
    gpu = gpus.pop()
    merged = {"cells": [c for sw in sweeps for c in sw["cells"]]}
    table = {"provenance": {"gpu": gpu,
                            "sweeps": [{"file": os.path.relpath(p), "commit": sw.get("commit"),
                                        "torch": sw.get("torch"), "triton": sw.get("triton"),
                                        "copy_bw_gbs": sw.get("copy_bw_gbs")}
                                       for p, sw in zip(args.sweep, sweeps)]},
             "shapes": rows_from_sweep(merged, args.keep_faster)}
    for p, sw in zip(args.replace, replace):
        for key, kinds in rows_from_sweep(sw).items():
            for kind, rows in kinds.items():
                table["shapes"].setdefault(key, {}).setdefault(kind, {}).update(rows)
        table["provenance"]["sweeps"].append({"file": os.path.relpath(p), "commit": sw.get("commit"),
                                              "torch": sw.get("torch"), "triton": sw.get("triton"),
                                              "copy_bw_gbs": sw.get("copy_bw_gbs"), "replace": True})
    if args.trace:
        traces = [json.load(open(p)) for p in args.trace]
        if {t.get("gpu") for t in traces} != {gpu}:
            print(f"--trace: every file must be of {gpu}", file=sys.stderr)
            return 2
        for line in apply_traces(table["shapes"], traces):
            print("adopted", line)
        table["provenance"]["traces"] = [{"file": os.path.relpath(p), "commit": t.get("commit"),
                                          "triton": t.get("triton"), "copy_bw_gbs": t.get("copy_bw_gbs")}
                                         for p, t in zip(args.trace, traces)]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, gpu.replace(" ", "_") + ".json")
    keep_route_rule(table, path)
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    n = sum(len(r) for kinds in table["shapes"].values() for r in kinds.values())
    print(f"wrote {path}: {n} rows for {len(table['shapes'])} shapes on {gpu}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

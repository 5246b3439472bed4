"""Write kernels/configs/<GPU>.json (the tuned fused_moe configs) from a sweep_moe.py result.

    python benchmarks/gpu/tuned_configs.py SWEEP_JSON [SWEEP_JSON ...] [--out kernels/configs]
Several sweeps of one GPU merge (a later file's cell replaces an earlier one's, or with
--keep-faster the faster of them). Each cell's winner (the tile search's best, or the faster structure where no search ran) becomes the
row of its shape, routing kind (dense top-k, or BASE-selected: "budget") and T. The provenance
(GPU, commit, torch/triton, the sweep file) is copied in. kernels/moe_configs.py reads the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kernel_common import SHAPES  # noqa: E402
from sweep_moe import structures  # noqa: E402

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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep", nargs="+")
    ap.add_argument("--keep-faster", action="store_true",
                    help="where sweeps share a cell keep the faster row (default: the later file's)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "kernels",
                                                  "configs"))
    args = ap.parse_args()
    sweeps = [json.load(open(p)) for p in args.sweep]
    gpus = {sw.get("gpu") for sw in sweeps}
    if any(not sw.get("cells") for sw in sweeps) or len(gpus) != 1:
        print(f"{args.sweep}: every sweep needs cells, all of one GPU (got {sorted(map(str, gpus))})",
              file=sys.stderr)
        return 2
    gpu = gpus.pop()
    merged = {"cells": [c for sw in sweeps for c in sw["cells"]]}
    table = {"provenance": {"gpu": gpu,
                            "sweeps": [{"file": os.path.relpath(p), "commit": sw.get("commit"),
                                        "torch": sw.get("torch"), "triton": sw.get("triton"),
                                        "copy_bw_gbs": sw.get("copy_bw_gbs")}
                                       for p, sw in zip(args.sweep, sweeps)]},
             "shapes": rows_from_sweep(merged, args.keep_faster)}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, gpu.replace(" ", "_") + ".json")
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    n = sum(len(r) for kinds in table["shapes"].values() for r in kinds.values())
    print(f"wrote {path}: {n} rows for {len(table['shapes'])} shapes on {gpu}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

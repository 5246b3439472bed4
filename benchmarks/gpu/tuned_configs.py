"""Write kernels/configs/<GPU>.json (the tuned fused_moe configs) from a sweep_moe.py result.

    python benchmarks/gpu/tuned_configs.py SWEEP_JSON [--out kernels/configs]
Each cell's winner (the tile search's best, or the faster structure where no search ran) becomes the
row of its shape, routing kind (dense top-k, or BASE-selected: "budget") and T. The provenance
(GPU, commit, torch/triton, the sweep file) is copied in. kernels/moe_configs.py reads the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kernel_common import SHAPES  # noqa: E402

from base_sglang.kernels.fused_moe import MoeConfig, default_config  # noqa: E402
from base_sglang.kernels.moe_configs import shape_key  # noqa: E402


def rows_from_sweep(sweep: dict) -> dict:
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
        row = {**dataclasses.asdict(cfg), "us": us, "floor_us": c["floor_us"]}
        shapes.setdefault(shape_key(E, H, I, K), {}).setdefault(kind, {})[str(c["T"])] = row
    return shapes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "kernels",
                                                  "configs"))
    args = ap.parse_args()
    sweep = json.load(open(args.sweep))
    if not sweep.get("cells"):
        print(f"{args.sweep}: no cells", file=sys.stderr)
        return 2
    gpu = sweep["gpu"]
    table = {"provenance": {k: sweep.get(k) for k in ("gpu", "commit", "torch", "triton", "settings")}
             | {"sweep": os.path.relpath(args.sweep), "copy_bw_gbs": sweep.get("copy_bw_gbs")},
             "shapes": rows_from_sweep(sweep)}
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

"""base_fused_select tile sweep on the GPU: (num_warps, ROWS) per shape and T, graph-replay median.

    python benchmarks/gpu/sweep_fused_tiles.py --out DIR
Writes fused_tiles.json under DIR; the library's choice (fused_blocks) is the row "default".
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kernel_common import DEVICE, SHAPES, graph_time_us, make_routing, provenance  # noqa: E402

from base_sglang.kernels.base_fused import base_fused_select  # noqa: E402
from base_sglang.testing.predictors import random_predictor  # noqa: E402

VARIANTS = ["default", "8,8", "4,4", "4,2", "2,2", "2,1", "1,1"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="1,16,32,64")
    args = ap.parse_args()
    rows = []
    print(f"{'shape':14} {'T':>4} " + " ".join(f"{v:>8}" for v in VARIANTS), flush=True)
    for shape in ("qwen3-30b-a3b", "olmoe-1b-7b"):
        s = SHAPES[shape]
        E, K, H = s["E"], s["K"], s["H"]
        pred = random_predictor(E, H, K, seed=7, scale=0.02, bias_scale=0.1,
                                architecture="synthetic").to(DEVICE)
        for T in [int(t) for t in args.tokens.split(",")]:
            r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
            x = torch.randn(T, H, device=DEVICE).bfloat16()
            bud = torch.full((T,), 16, device=DEVICE)
            call = functools.partial(base_fused_select, x, r.ids, r.weights, r.logits, bud,
                                     pred.weight[0], pred.bias[0])
            ref = call()
            times = {}
            for v in VARIANTS:
                if v == "default":
                    os.environ.pop("BASE_FUSED_TILES", None)
                else:
                    os.environ["BASE_FUSED_TILES"] = v
                got = call()
                same = torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
                t = graph_time_us(call)
                times[v] = round(t, 2) if same else None
            os.environ.pop("BASE_FUSED_TILES", None)
            rows.append(dict(shape=shape, T=T, us=times))
            print(f"{shape:14} {T:>4} " + " ".join(f"{times[v] or float('nan'):>8.1f}"
                                                    for v in VARIANTS), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fused_tiles.json"), "w") as f:
        json.dump({"meta": provenance({"variants": "num_warps,ROWS"}), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tiles and top-k method of the folded route-select launch on the GPU (issue 12).

    python benchmarks/gpu/sweep_route.py --out DIR [--shapes ...] [--tokens 1,8,16,32,64] [--budget-s 240]
For each shape and decode batch T (budget M = 16, 4 for E = 8): the dense routing (GEMM [T, H] x
[H, E] + the top-k launch) and, for each (num_warps, rows per block, iterative top-k, scratch row)
of kernel_common.ROUTE_VARIANTS through BASE_ROUTE_TILES, the folded sequence (GEMM x [H, 2E] + base_route_select), each a CUDA graph of
10 calls, median of 15 replays. Prints the best variant per cell and writes sweep_route.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kernel_common import (  # noqa: E402
    DEVICE,
    ROUTE_VARIANTS,
    SHAPES,
    folded_layer,
    graph_time_us,
    provenance,
)

from base_sglang.core import DEFAULT_POLICY, SelectionConfig  # noqa: E402
from base_sglang.kernels import base_route_select  # noqa: E402
from base_sglang.kernels.base_route import route_blocks  # noqa: E402


def variants(T: int) -> list[str]:
    return ROUTE_VARIANTS.get(T, ROUTE_VARIANTS[min(ROUTE_VARIANTS, key=lambda t: abs(t - T))])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="qwen3-30b-a3b,olmoe-1b-7b")
    ap.add_argument("--tokens", default="1,8,16,32,64")
    ap.add_argument("--budget-s", type=float, default=240.0)
    args = ap.parse_args()
    bad = [x for x in args.shapes.split(",") if x not in SHAPES]
    if bad:
        ap.error(f"--shapes: unknown {bad}; choose from {sorted(SHAPES)}")
    t_start = time.time()
    rows = []
    cfg = SelectionConfig(policy=DEFAULT_POLICY)
    for shape in args.shapes.split(","):
        f = folded_layer(shape, cfg)
        E, K, H, norm, router, w2, b, comb = f.E, f.K, f.H, f.norm, f.router, f.w2, f.b, f.comb
        M = 16 if E > 16 else 4
        for T in [int(t) for t in args.tokens.split(",")]:
            x = torch.randn(T, H, device=DEVICE).bfloat16()
            bud = torch.full((T,), M, device=DEVICE)
            os.environ.pop("BASE_ROUTE_TILES", None)
            default = route_blocks(T, E, K)
            router_us = graph_time_us(lambda: base_route_select(  # noqa: B023
                x @ router.T, None, None, bud, top_k=K, renormalize=norm))  # noqa: B023

            def folded():
                sc = x @ w2.T  # noqa: B023
                return base_route_select(sc[:, :E], sc[:, E:], b, bud, top_k=K,  # noqa: B023
                                         renormalize=norm, **comb)  # noqa: B023

            default_us = graph_time_us(folded)
            cell = dict(shape=shape, T=T, M=M, router_us=round(router_us, 2),
                        default=",".join(str(int(default[k]))
                                         for k in ("num_warps", "BLOCK_T", "ITER", "SCRATCH")),
                        default_us=round(default_us, 2), variants={})
            for v in variants(T):
                if time.time() - t_start > args.budget_s:
                    break
                os.environ["BASE_ROUTE_TILES"] = v
                try:
                    cell["variants"][v] = round(graph_time_us(folded), 2)
                except Exception as e:  # a variant that does not compile or run
                    cell["variants"][v] = repr(e)[:80]
            os.environ.pop("BASE_ROUTE_TILES", None)
            timed = {k: u for k, u in cell["variants"].items() if isinstance(u, float)}
            best = min(timed, key=timed.get) if timed else None
            cell["best"], cell["best_us"] = best, timed.get(best)
            rows.append(cell)
            print(f"{shape:14} T={T:<3} router {router_us:6.1f}  folded default {default_us:6.1f} "
                  f"({cell['default']})  best {cell['best_us']} ({best})  "
                  f"+{(cell['best_us'] or default_us) - router_us:5.1f} us", flush=True)
            with open(os.path.join(args.out, "sweep_route.json"), "w") as f:
                json.dump({"meta": provenance({"budget_s": args.budget_s}), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""moe_align alone on the GPU: the one-hot scan kernel against the sort kernel (same outputs).

    python3 benchmarks/gpu/time_align.py --out DIR [--tokens 1,8,16,32,64,128]
Each cell: the dense top-k ids of kernel_common's skewed routing (and a BASE-like drop of 40 % of
the slots), both kernels checked equal, then timed alone in a CUDA graph of 10 calls (median of 15
replays, PDL as shipped).                                          -> DIR/align.json, printed table
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kernel_common import SHAPES, graph_time_us, make_routing, provenance  # noqa: E402

from base_sglang.kernels.moe_align import moe_align  # noqa: E402


def same(a, b) -> bool:
    n = int(a.num_blocks)
    if not (torch.equal(a.counts, b.counts) and n == int(b.num_blocks)):
        return False
    lists = all(torch.equal(a.pair_list[e, :c], b.pair_list[e, :c]) for e, c in enumerate(a.counts.tolist()))
    return lists and torch.equal(a.block_expert[:n], b.block_expert[:n]) and torch.equal(
        a.block_row[:n], b.block_row[:n])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="1,8,16,32,64,128")
    args = ap.parse_args()
    rows = []
    print(f"{'shape':15s} {'T':>4s} {'drop':>5s} {'scan us':>8s} {'sort us':>8s} {'sort/scan':>9s} equal")
    for shape, s in SHAPES.items():
        for T in [int(t) for t in args.tokens.split(",")]:
            for drop in (0.0, 0.4):
                r = make_routing(T, s["E"], s["K"], s["norm_topk_prob"], seed=T)
                ids = r.ids.int().clone()
                if drop:
                    g = torch.Generator(device="cpu").manual_seed(T)
                    ids[(torch.rand(ids.shape, generator=g) < drop).to(ids.device)] = -1
                bm = 16
                ok = same(moe_align(ids, s["E"], bm, sort=False), moe_align(ids, s["E"], bm, sort=True))
                scan = graph_time_us(functools.partial(moe_align, ids, s["E"], bm, sort=False))
                srt = graph_time_us(functools.partial(moe_align, ids, s["E"], bm, sort=True))
                rows.append(dict(shape=shape, T=T, drop=drop, scan_us=round(scan, 2), sort_us=round(srt, 2),
                                 sort_over_scan=round(srt / scan, 3), equal=ok))
                print(f"{shape:15s} {T:4d} {drop:5.1f} {scan:8.2f} {srt:8.2f} {srt / scan:9.3f} {ok}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "align.json"), "w") as f:
        json.dump({**provenance({"tokens": args.tokens, "block_m": 16}), "rows": rows}, f, indent=1)
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Where one BASE MoE layer's time goes: per-kernel GPU time of selection + fused_moe (issue 12).

    python benchmarks/gpu/profile_moe.py --out DIR [--cases qwen3-30b-a3b:16:16,...]
Each case (shape:T:M, M = "dense" for top-k routing without selection) is captured as one CUDA graph
of 20 layers (selection then fused_moe, rotating 3 weight copies as bench_fused_moe does) and
replayed under torch.profiler. Per kernel name: calls per layer, mean µs per call, share; and the
graph's wall time per layer from CUDA events, so wall - sum(kernels) is the time between kernels
(launch gaps and dependency waits the PDL overlap did not hide). Prints a table per case and writes
profile_moe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_fused_moe import COPIES  # noqa: E402
from kernel_common import (  # noqa: E402
    SHAPES,
    capture_graph,
    make_experts,
    make_routing,
    provenance,
    replay_time_us,
)

from base_sglang.core import SelectionConfig  # noqa: E402
from base_sglang.kernels import base_select_experts, fused_moe  # noqa: E402
from base_sglang.testing.predictors import random_predictor  # noqa: E402

LAYERS = 20


def run_case(shape: str, T: int, M: str) -> dict:
    s = SHAPES[shape]
    E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
    weights = [make_experts(E, H, I, seed=c) for c in range(COPIES)]
    pred = random_predictor(E, H, K, seed=7, scale=0.02, bias_scale=0.1,
                            architecture="synthetic").to("cuda")
    r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
    hidden = torch.randn(T, H, device="cuda").bfloat16()
    budget = torch.full((T,), E if M == "dense" else int(M), device="cuda")
    max_experts = None if M == "dense" else int(M)

    def layer(i):
        gu, dn = weights[i % COPIES]
        if M == "dense":
            return fused_moe(hidden, r.ids, r.weights, gu, dn)
        sel = base_select_experts(r.logits, r.ids, r.weights, hidden, budget, 0,
                                  SelectionConfig(policy="base"), pred,
                                  norm_topk_prob=s["norm_topk_prob"])
        return fused_moe(hidden, sel.ids, sel.weights, gu, dn, max_experts=max_experts)

    state = [0]

    def next_layer():
        state[0] += 1
        return layer(state[0])

    g = capture_graph(next_layer, LAYERS)
    wall = replay_time_us(g, LAYERS, reps=20)
    reps = 10
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            g.replay()
        torch.cuda.synchronize()
    per = defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name].append(ev.time_range.elapsed_us())  # µs of one kernel
    kernels = {name: dict(calls_per_layer=round(len(ts) / (reps * LAYERS), 2),
                          us_per_call=round(statistics.mean(ts), 2),
                          us_per_layer=round(sum(ts) / (reps * LAYERS), 2))
               for name, ts in per.items()}
    busy = sum(k["us_per_layer"] for k in kernels.values())
    return dict(shape=shape, T=T, M=M, wall_us_per_layer=round(wall, 2),
                kernel_us_per_layer=round(busy, 2), between_us_per_layer=round(wall - busy, 2),
                kernels=kernels)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="qwen3-30b-a3b:16:16,qwen3-30b-a3b:16:dense,"
                    "qwen3-30b-a3b:1:16,qwen3-30b-a3b:1:dense,olmoe-1b-7b:16:16")
    args = ap.parse_args()
    results = []
    for case in args.cases.split(","):
        shape, T, M = case.split(":")
        res = run_case(shape, int(T), M)
        results.append(res)
        print(f"\n{shape} T={T} M={M}: wall {res['wall_us_per_layer']:.1f} µs/layer, kernels "
              f"{res['kernel_us_per_layer']:.1f}, between {res['between_us_per_layer']:.1f}")
        for name, k in sorted(res["kernels"].items(), key=lambda kv: -kv[1]["us_per_layer"]):
            print(f"  {k['us_per_layer']:7.2f} µs/layer  {k['calls_per_layer']:4.1f} x "
                  f"{k['us_per_call']:7.2f}  {name[:90]}")
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "profile_moe.json"), "w") as f:
            json.dump({**provenance({"layers_per_graph": LAYERS, "copies": COPIES}),
                       "cases": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

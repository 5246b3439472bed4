"""The one-launch MoE and the read-only stream at one Qwen3-30B-A3B cell, once each, for Nsight Compute.

    ncu --clock-control none --set full --profile-from-start off -o OUT/moe \
        python benchmarks/gpu/ncu_moe_one.py --tokens 16 --budgets 8 16 [--variants shipped,dn=64:64]
For each T and budget M (ids from base_select_experts, policy base, random predictor, as
trace_moe_one.py): moe_one with the shipped config (and each variant, trace_moe_one's syntax), then
read_floor's stream of the same kept experts' bytes (2 programs per SM, 65536-element chunks, 4
stages, 4 warps). Everything runs twice first; only the last call of each runs between
cudaProfilerStart and Stop, each on a weight copy the previous call did not touch (L2 cold, as in
the graph timings), so ncu profiles one launch of each. Prints each call's eager CUDA-event time.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kernel_common import DEVICE, SHAPES, make_experts, make_routing  # noqa: E402
from read_floor import read_kept  # noqa: E402
from trace_moe_one import one_kwargs, parse_variant  # noqa: E402

from base_sglang.core import SelectionConfig  # noqa: E402
from base_sglang.kernels import base_select_experts  # noqa: E402
from base_sglang.kernels.fused_moe import default_config, device_name  # noqa: E402
from base_sglang.kernels.moe_one import moe_one  # noqa: E402
from base_sglang.kernels.utils import num_sms  # noqa: E402
from base_sglang.testing.predictors import random_predictor  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, nargs="+", default=[16])
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--variants", default="shipped")
    args = ap.parse_args()
    s = SHAPES[args.shape]
    E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
    copies = [make_experts(E, H, I, seed=c) for c in range(3)]
    pred = random_predictor(E, H, K, seed=7, scale=0.02, bias_scale=0.1,
                            architecture="synthetic").to(DEVICE)
    sms = num_sms(torch.device(DEVICE))
    calls = []
    for T in args.tokens:
        r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
        hidden = torch.randn(T, H, device=DEVICE).bfloat16()
        for M in args.budgets:
            sel = base_select_experts(r.logits, r.ids, r.weights, hidden,
                                      torch.full((T,), M, device=DEVICE), 0,
                                      SelectionConfig(policy="base"), pred,
                                      norm_topk_prob=s["norm_topk_prob"])
            ids, w = sel.ids, sel.weights
            kept = torch.unique(ids[ids >= 0]).to(torch.int32)
            shipped = default_config(T, E, K, M, hidden=H, inter=I, gpu=device_name(hidden.device))
            cfg = dataclasses.replace(shipped, one_launch=True, pair_major=False)
            for name in args.variants.split(","):
                vcfg = parse_variant(name, cfg)
                kw = one_kwargs(vcfg, vcfg.ctas_per_sm * num_sms(hidden.device))
                calls.append((f"moe_one T={T} M={M} {name}",
                              lambda i, kw=kw, ids=ids, w=w, hidden=hidden: moe_one(
                                  hidden, ids, w, copies[i][0], copies[i][1], **kw)))
            out = torch.zeros(2 * sms, dtype=torch.float32, device=DEVICE)
            calls.append((f"read T={T} M={M} ({kept.numel()} experts)",
                          lambda i, kept=kept, out=out: read_kept(
                              copies[i][0], copies[i][1], kept, out, programs=2 * sms, chunk=min(65536, H * I),
                              stages=4, warps=4, mode="all")))
    for _, fn in calls:  # compile and warm up
        fn(0)
        fn(1)
    if DEVICE != "cuda":  # a dry run (BASE_TINY=1 TRITON_INTERPRET=1): every call ran
        print(f"{len(calls)} calls ran (no GPU: nothing profiled)")
        return 0
    torch.cuda.synchronize()
    for n, (name, fn) in enumerate(calls):
        fn(n % 3)  # the profiled call reads copy n + 1 (mod 3): not in L2
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.cudart().cudaProfilerStart()
        a.record()
        fn((n + 1) % 3)
        b.record()
        torch.cuda.cudart().cudaProfilerStop()
        b.synchronize()
        print(f"{name}: {a.elapsed_time(b) * 1e3:.1f} us eager", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

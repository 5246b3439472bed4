"""The selection launches at one Qwen3-30B-A3B cell, run once each for Nsight Compute (issue 12).

    ncu --clock-control none --set full --profile-from-start off -o OUT/sel \
        python benchmarks/gpu/ncu_select.py --tokens 16 64
For each T: the folded route-select launch (base_route_select on the stacked GEMM's output, budget
M = 16), then the router's top-k launch + the unfolded selection the rule runs at that T
(base_fused_select at T <= 32, base_score + base_select above). Everything is compiled and run
twice first; only the last call of each runs between cudaProfilerStart and Stop, so ncu profiles
one launch of each kernel. Prints each call's eager CUDA-event time (a sanity check).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kernel_common import DEVICE, SHAPES, folded_layer  # noqa: E402

from base_sglang.core import DEFAULT_POLICY, SelectionConfig  # noqa: E402
from base_sglang.kernels import base_route_select, base_select_experts  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--budget", type=int, default=16)
    args = ap.parse_args()
    cfg = SelectionConfig(policy=DEFAULT_POLICY)
    f = folded_layer(args.shape, cfg)
    E, K, H, norm, pred, router, w2, b, comb = (f.E, f.K, f.H, f.norm, f.pred, f.router, f.w2, f.b,
                                                f.comb)
    calls = []
    for T in args.tokens:
        x = torch.randn(T, H, device=DEVICE).bfloat16()
        bud = torch.full((T,), args.budget, device=DEVICE)
        sc = x @ w2.T  # [T, 2E]
        lg = x @ router.T  # [T, E]

        def folded(sc=sc, bud=bud):  # this T's tensors, bound now: the calls run after the loop
            return base_route_select(sc[:, :E], sc[:, E:], b, bud, top_k=K,
                                     renormalize=norm, **comb)

        def unfolded(lg=lg, x=x, bud=bud):
            ids, w, _c, _r = base_route_select(lg, None, None, bud, top_k=K, renormalize=norm)
            return base_select_experts(lg, ids, w, x, bud, 0, cfg, pred, norm_topk_prob=norm)

        for name, fn in (("folded", folded), ("unfolded", unfolded)):
            for _ in range(2):
                fn()
            calls.append((T, name, fn))
    if DEVICE != "cuda":  # a dry run under TRITON_INTERPRET=1 (BASE_TINY=1) ends here
        print(f"dry run: {len(calls)} calls ran")
        return 0
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for T, name, fn in calls:
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        fn()
        en.record()
        torch.cuda.synchronize()
        print(f"{args.shape} T={T} {name}: {st.elapsed_time(en) * 1e3:.1f} us (eager, one call)",
              flush=True)
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

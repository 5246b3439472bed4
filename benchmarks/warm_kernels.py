"""Fill the Triton cache for the device run, in parallel, before anything is timed.

    python benchmarks/warm_kernels.py --worker I --workers N [--sglang-root DIR]
Compiling (~1 s per kernel variant, ~300 variants: every shape x T bucket x tuning candidate, the
selection with PDL on and off, SGLang's kernels at each T's config) would otherwise eat most of the
device call inside the timed benchmarks, one variant at a time. Each worker runs its share of the
(shape, T) cases through exactly the launches the benchmarks make (same dtypes, shapes and
strides, so the same specialisations and cache keys), once, untimed; the benchmarks then load the
compiled kernels from TRITON_CACHE_DIR. Nothing here is measured or checked.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fused_moe import CANDIDATES, TOKENS, budgets_for  # noqa: E402
from kernel_common import DEVICE, SHAPES, make_experts, make_routing  # noqa: E402

from base_sglang.core import Predictor, PredictorMeta, SelectionConfig  # noqa: E402
from base_sglang.kernels import base_select, base_select_experts, fused_moe  # noqa: E402
from base_sglang.kernels.fused_moe import MoeConfig, resolve_decode  # noqa: E402
from base_sglang.kernels.moe_up import moe_up  # noqa: E402


def warm_case(shape: str, T: int, experts, sgl) -> None:
    s = SHAPES[shape]
    E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
    gate_up, down = experts
    g = torch.Generator().manual_seed(7)
    pred = Predictor(meta=PredictorMeta("synthetic", "synthetic", 1, [0], H, E, K),
                     weight=torch.randn(1, E, H, generator=g) * 0.02,
                     bias=torch.randn(1, E, generator=g) * 0.1).to(DEVICE)
    r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
    hidden = torch.randn(T, H, device=DEVICE).bfloat16()
    cfg = SelectionConfig(policy="base")
    sel = {}
    for M in budgets_for(E, K) + [E, 16 if E > 16 else 4]:
        bud = torch.full((T,), M, device=DEVICE)
        for pdl in ("1", "0"):  # bench_base_select times both
            os.environ["BASE_PDL"] = pdl
            out = base_select_experts(r.logits, r.ids, r.weights, hidden, bud, 0, cfg, pred,
                                      norm_topk_prob=s["norm_topk_prob"])
            base_select(hidden, r.ids, r.weights, r.logits, bud, pred.weight[0], pred.bias[0])
        os.environ["BASE_PDL"] = "1"
        sel[M] = (out.ids, out.weights)
    for ids, w in (sel[E], sel[budgets_for(E, K)[1]]):
        for d in CANDIDATES.values():
            fused_moe(hidden, ids, w, gate_up, down, config=MoeConfig(decode=d))
            r_d = resolve_decode(d, T, H, I, hidden.device)
            act = torch.empty(T * K, I, dtype=hidden.dtype, device=DEVICE)
            moe_up(hidden, ids, w, gate_up, act, block_m=r_d.block_m, block_n=r_d.up_n,
                   block_k=r_d.up_k, num_warps=r_d.up_warps, num_stages=r_d.up_stages,
                   programs_per_sm=r_d.programs_per_sm, flatten=r_d.flatten)
        if sgl:
            scfg = sgl.config(T, E, H, I, K)
            if sgl.align_is_sglangs(ids, E):
                sgl.layer(hidden, gate_up, down, w, ids, scfg)
            else:
                sgl.forward(hidden, gate_up, down, w, ids, scfg, sgl.align(ids, E, scfg["BLOCK_SIZE_M"]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default=TOKENS)
    ap.add_argument("--sglang-root", default="")
    args = ap.parse_args()
    sgl = None
    if args.sglang_root:
        from sglang_triton_moe import SglangMoe

        sgl = SglangMoe(args.sglang_root)
    cases = [(sh, int(t)) for sh in args.shapes.split(",") for t in args.tokens.split(",")]
    mine = cases[args.worker::args.workers]
    t0 = time.time()
    experts, held = None, None
    for shape, T in mine:
        try:
            if held != shape:
                experts = None
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
                s = SHAPES[shape]
                experts, held = make_experts(s["E"], s["H"], s["I"]), shape
            warm_case(shape, T, experts, sgl)
            print(f"worker {args.worker}: {shape} T={T} warm at {time.time() - t0:.0f} s",
                  flush=True)
        except Exception:
            traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""BASE scoring + selection time per MoE layer on the GPU, alone and as a share of the dense MoE layer.

    python benchmarks/bench_base_select.py --out benchmarks/results
Times (CUDA-graph replay, median) for each shape and decode batch T, budget M = 16 (M = 4 for E = 8):
  triton_us   base_select_experts as an engine calls it (the default: base_fused_select, one
              cooperative launch with PDL, where kernels.select_experts.selection_kernel picks it,
              else the two launches below);
              triton_nopdl_us the same with BASE_PDL=0
  fused_us    base_fused_select at every T (cooperative); fused_nocoop_us as a plain launch
  two_us      BASE_SELECT_KERNEL=two: base_score then base_select
              (score_us, select_us: each of those two launches alone)
  empty_us    an empty Triton kernel launched the same way (PDL on): what one graph node costs
  torch_us    base_sglang.core.select_experts on the same GPU (the pure-torch path), for reference
  dense_us    dense MoE layer time from fused_moe.json in --out (ours and SGLang's, best of both),
              else our fused_moe measured here with its default config
  The folded router (kernels/base_route.py: the predictor's rows stacked under the router's, one
  GEMM, then softmax top-k + BASE in one launch), each a CUDA graph of the whole sequence:
  router_us   dense routing: GEMM [T, H] x [H, E] + the router's top-k (base_route_select without
              yhat: one launch, the baseline the folded launch replaces)
  folded_us   GEMM [T, H] x [H, 2E] + base_route_select (top-k + BASE)
  split_us    the same GEMM + base_route_split (top-k + BASE in two launches, default tiles)
  unfolded_us the same dense routing + base_select_experts (triton_us's path) after it
  torch_topk_us GEMM + torch softmax / topk / renormalise (SGLang's native path), for reference
  folded_share = (folded_us - router_us) / dense_us: what BASE adds to the router, as a share of
  the dense MoE layer (share_of_dense stays triton_us / dense_us, the unfolded selection alone)
Writes base_select.csv/.json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_common import (  # noqa: E402
    DEVICE,
    SHAPES,
    graph_time_us,
    make_experts,
    make_routing,
    provenance,
    write_rows,
)

from base_sglang.core import DEFAULT_POLICY, SelectionConfig, select_experts  # noqa: E402
from base_sglang.core.routing import fold_router  # noqa: E402
from base_sglang.kernels import (  # noqa: E402
    base_route_select,
    base_route_split,
    base_score,
    base_select,
    base_select_experts,
    fused_moe,
)
from base_sglang.kernels.base_fused import base_fused_select  # noqa: E402
from base_sglang.kernels.utils import launch_kwargs, use_pdl  # noqa: E402
from base_sglang.testing.predictors import random_predictor  # noqa: E402


@triton.jit
def _empty_kernel(x_ptr, USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def empty_launch(x: torch.Tensor) -> None:
    pdl = use_pdl(x.device)
    _empty_kernel[(1,)](x, USE_PDL=pdl, num_warps=4, **launch_kwargs(pdl))


def dense_times(out_dir: str) -> dict:
    """(shape, T) -> min(ours dense, sglang dense) from a fused_moe.json written in the same run."""
    path = os.path.join(out_dir, "fused_moe.json")
    if not os.path.exists(path):
        return {}
    rows = json.load(open(path))["rows"]
    return {(r["shape"], r["T"]): min(r["ours_us"], r.get("sglang_us", float("inf")))
            for r in rows if r["M"] == "dense"}


def folded_times(x, r, pred, bud, cfg, s, M) -> dict:
    """Graph times (us) of the dense routing, the folded routing + BASE, the unfolded path, torch."""
    E, K, H = s["E"], s["K"], s["H"]
    norm = s["norm_topk_prob"]
    router = (torch.randn(E, H, device=DEVICE) * H ** -0.5).bfloat16()  # [E, H]
    w2 = fold_router(router, pred, 0)  # [2E, H]
    comb = dict(combine=cfg.combine_mode(norm), alpha=cfg.renorm_alpha)
    b = pred.bias[0]

    def dense_route():
        logits = x @ router.T  # [T, E]
        return logits, base_route_select(logits, None, None, bud, top_k=K, renormalize=norm)

    def folded():
        scores = x @ w2.T  # [T, 2E]
        return base_route_select(scores[:, :E], scores[:, E:], b, bud, top_k=K, renormalize=norm,
                                 **comb)

    def split():
        scores = x @ w2.T  # [T, 2E]
        return base_route_split(scores[:, :E], scores[:, E:], b, bud, top_k=K, renormalize=norm,
                                **comb)

    def unfolded():
        logits, (ids, w, _, _) = dense_route()
        return base_select_experts(logits, ids, w, x, bud, 0, cfg, pred, norm_topk_prob=norm)

    def torch_topk():
        p = torch.softmax((x @ router.T).float(), -1)
        w, ids = p.topk(K, -1)
        return w / w.sum(-1, keepdim=True) if norm else w, ids

    return {"gemm_us": round(graph_time_us(lambda: x @ router.T), 2),
            "gemm2_us": round(graph_time_us(lambda: x @ w2.T), 2),
            "router_us": round(graph_time_us(dense_route), 2),
            "folded_us": round(graph_time_us(folded), 2),
            "split_us": round(graph_time_us(split), 2),
            "unfolded_us": round(graph_time_us(unfolded), 2),
            "torch_topk_us": round(graph_time_us(torch_topk), 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/kernels_h200")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="1,8,16,32,64,128")
    ap.add_argument("--dense-from", default=None,
                    help="directory of a fused_moe.json with the dense MoE times (default: --out)")
    args = ap.parse_args()
    known = dense_times(args.dense_from or args.out)
    rows = []
    meta = provenance({"tokens": args.tokens, "budget": "M=16 (M=4 for E=8)",
                       "timing": "CUDA graph of 10 calls, median of 15 replays",
                       "dense_source": (f"fused_moe.json in {args.dense_from or args.out}" if known
                                        else "fused_moe here")})
    print(f"{'shape':14} {'T':>4} {'empty':>6} {'two':>7} {'fused':>7} {'nocoop':>7} {'default':>7} "
          f"{'torch':>7} {'dense':>8} {'share':>6} | {'router':>6} {'folded':>6} {'unfold':>6} "
          f"{'torchk':>6} {'fshare':>6}", flush=True)
    for shape in args.shapes.split(","):
        s = SHAPES[shape]
        E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
        M = 16 if E > 16 else 4
        pred = random_predictor(E, H, K, seed=7, scale=0.02, bias_scale=0.1,
                                architecture="synthetic").to(DEVICE)
        a, b = pred.weight[0], pred.bias[0]
        cfg = SelectionConfig(policy=DEFAULT_POLICY)  # what the plugin runs
        experts = None
        for T in [int(x) for x in args.tokens.split(",")]:
            try:
                r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
                x = torch.randn(T, H, device=DEVICE).bfloat16()
                bud = torch.full((T,), M, device=DEVICE)
                cost = base_score(x, r.ids, r.weights, bud, a, b)
                score_us = graph_time_us(lambda: base_score(x, r.ids, r.weights, bud, a, b, out=cost))  # noqa: B023
                comb = dict(combine=cfg.combine_mode(s["norm_topk_prob"]), alpha=cfg.renorm_alpha)
                select_us = graph_time_us(lambda: base_select(cost, r.ids, r.weights, r.logits, bud,  # noqa: B023
                                                              **comb))  # noqa: B023
                args_ = (r.logits, r.ids, r.weights, x, bud, 0, cfg, pred)
                kw = dict(norm_topk_prob=s["norm_topk_prob"])
                triton_us = graph_time_us(lambda: base_select_experts(*args_, **kw))  # noqa: B023
                os.environ["BASE_SELECT_KERNEL"] = "two"
                two_us = graph_time_us(lambda: base_select_experts(*args_, **kw))  # noqa: B023
                del os.environ["BASE_SELECT_KERNEL"]
                os.environ["BASE_SELECT_KERNEL"] = "fused"
                fused_us = graph_time_us(lambda: base_select_experts(*args_, **kw))  # noqa: B023
                del os.environ["BASE_SELECT_KERNEL"]
                nocoop_us = graph_time_us(lambda: base_fused_select(  # noqa: B023
                    x, r.ids, r.weights, r.logits, bud, a, b, **comb, cooperative=False))  # noqa: B023
                empty_us = graph_time_us(lambda: empty_launch(bud))  # noqa: B023
                os.environ["BASE_PDL"] = "0"
                nopdl_us = graph_time_us(lambda: base_select_experts(*args_, **kw))  # noqa: B023
                os.environ["BASE_PDL"] = "1"
                torch_us = graph_time_us(lambda: select_experts(*args_, **kw))  # noqa: B023
                folded = folded_times(x, r, pred, bud, cfg, s, M)
                dense = known.get((shape, T))
                if dense is None:
                    if experts is None:
                        experts = make_experts(E, H, I)
                    gu, dn = experts
                    dense = graph_time_us(lambda: fused_moe(x, r.ids, r.weights, gu, dn))  # noqa: B023
                share = triton_us / dense
                rows.append(dict(shape=shape, T=T, M=M, score_us=round(score_us, 2),
                                 select_us=round(select_us, 2), two_us=round(two_us, 2),
                                 triton_us=round(triton_us, 2), triton_nopdl_us=round(nopdl_us, 2),
                                 fused_us=round(fused_us, 2), fused_nocoop_us=round(nocoop_us, 2), empty_us=round(empty_us, 2),
                                 torch_us=round(torch_us, 2), dense_moe_us=round(dense, 2),
                                 share_of_dense=round(share, 4), **folded,
                                 folded_share=round((folded["folded_us"] - folded["router_us"])
                                                    / dense, 4)))
                print(f"{shape:14} {T:>4} {empty_us:>6.1f} {two_us:>7.1f} {fused_us:>7.1f} "
                      f"{nocoop_us:>7.1f} {triton_us:>7.1f} {torch_us:>7.1f} {dense:>8.1f} "
                      f"{share:>6.1%} | {folded['router_us']:>6.1f} {folded['folded_us']:>6.1f} "
                      f"{folded['unfolded_us']:>6.1f} {folded['torch_topk_us']:>6.1f} "
                      f"{rows[-1]['folded_share']:>6.1%}", flush=True)
                write_rows(os.path.join(args.out, "base_select.csv"), rows, meta)
            except Exception:
                traceback.print_exc()
        experts = None
    write_rows(os.path.join(args.out, "base_select.csv"), rows, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())

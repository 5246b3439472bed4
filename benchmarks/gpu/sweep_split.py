"""The folded route-select in two launches (kernels/base_route_split.py) against one launch and the
unfolded path, on the GPU (issue 12).

    python benchmarks/gpu/sweep_split.py --out DIR [--shapes ...] [--tokens 8,16,32,64,128] [--budget-s 200]
For each shape and decode batch T (budget M = 16, 4 for E = 8), each a CUDA graph of 10 calls,
median of 15 replays:
  router_us   dense routing: GEMM [T, H] x [H, E] + the router's top-k launch (the baseline)
  fold_us     GEMM [T, H] x [H, 2E] + base_route_select (one launch)
  unfold_us   the dense routing + base_select_experts (scoring from the hidden states)
  split_us    GEMM [T, H] x [H, 2E] + base_route_split at its default tiles, and per variant of
              kernel_common.SPLIT_VARIANTS (BASE_ROUTE_SPLIT_TILES)
  *_adds      minus router_us: what BASE adds to the routing; dense_us (kernels_h200_moe/final,
              as bench_base_select) gives the shares
Writes sweep_split.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_base_select import dense_times  # noqa: E402
from kernel_common import DEVICE, SHAPES, SPLIT_VARIANTS, folded_layer, graph_time_us, provenance  # noqa: E402

from base_sglang.core import DEFAULT_POLICY, SelectionConfig  # noqa: E402
from base_sglang.kernels import base_route_select, base_route_split, base_select_experts  # noqa: E402
from base_sglang.kernels.base_route_split import split_blocks  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="qwen3-30b-a3b,olmoe-1b-7b")
    ap.add_argument("--tokens", default="8,16,32,64,128")
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--dense-from", default="benchmarks/results/kernels_h200_moe/final")
    args = ap.parse_args()
    bad = [x for x in args.shapes.split(",") if x not in SHAPES]
    if bad:
        ap.error(f"--shapes: unknown {bad}; choose from {sorted(SHAPES)}")
    t_start = time.time()
    dense = dense_times(args.dense_from)
    cfg = SelectionConfig(policy=DEFAULT_POLICY)
    rows = []
    print(f"{'shape':14} {'T':>4} {'router':>7} {'fold':>7} {'unfold':>7} {'split':>7} "
          f"{'best split':>12} {'us':>7} {'dense':>7} {'share':>6}", flush=True)
    for shape in args.shapes.split(","):
        f = folded_layer(shape, cfg)
        E, K, H, norm = f.E, f.K, f.H, f.norm
        M = 16 if E > 16 else 4
        for T in [int(t) for t in args.tokens.split(",")]:
            if time.time() - t_start > args.budget_s:
                break
            x = torch.randn(T, H, device=DEVICE).bfloat16()
            bud = torch.full((T,), M, device=DEVICE)
            os.environ.pop("BASE_ROUTE_SPLIT_TILES", None)

            def route():
                logits = x @ f.router.T  # noqa: B023
                return logits, base_route_select(logits, None, None, bud, top_k=K,  # noqa: B023
                                                 renormalize=norm)  # noqa: B023

            def fold():
                sc = x @ f.w2.T  # noqa: B023
                return base_route_select(sc[:, :E], sc[:, E:], f.b, bud, top_k=K,  # noqa: B023
                                         renormalize=norm, **f.comb)  # noqa: B023

            def unfold():
                logits, (ids, w, _, _) = route()
                return base_select_experts(logits, ids, w, x, bud, 0, cfg, f.pred,  # noqa: B023
                                           norm_topk_prob=norm)  # noqa: B023

            def split():
                sc = x @ f.w2.T  # noqa: B023
                return base_route_split(sc[:, :E], sc[:, E:], f.b, bud, top_k=K,  # noqa: B023
                                        renormalize=norm, **f.comb)  # noqa: B023

            d = split_blocks(T, E, K)
            cell = dict(shape=shape, T=T, M=M, E=E, router_us=round(graph_time_us(route), 2),
                        fold_us=round(graph_time_us(fold), 2),
                        unfold_us=round(graph_time_us(unfold), 2),
                        split_default=f"{d['BLOCK_T']},{d['warps1']},{d['warps2']}",
                        split_us=round(graph_time_us(split), 2), variants={})
            for v in SPLIT_VARIANTS:
                if time.time() - t_start > args.budget_s:
                    break
                os.environ["BASE_ROUTE_SPLIT_TILES"] = v
                try:
                    cell["variants"][v] = round(graph_time_us(split), 2)
                except Exception as e:  # a variant that does not compile or run
                    cell["variants"][v] = f"error: {e!r}"[:120]
                finally:
                    os.environ.pop("BASE_ROUTE_SPLIT_TILES", None)
            timed = {k: v for k, v in cell["variants"].items() if isinstance(v, float)}
            best = min(timed, key=timed.get) if timed else None
            dense_us = dense.get((shape, T))
            for k in ("fold", "unfold", "split"):
                cell[f"{k}_adds_us"] = round(cell[f"{k}_us"] - cell["router_us"], 2)
            cell.update(best_variant=best, best_us=timed.get(best), dense_us=dense_us,
                        split_share=(round(cell["split_adds_us"] / dense_us, 4) if dense_us else None))
            rows.append(cell)
            write(args, rows)  # after every cell: a call cut short keeps what it measured
            print("   ", " ".join(f"{k}={v}" for k, v in cell["variants"].items()), flush=True)
            share = f"{cell['split_share']:.1%}" if dense_us else "-"
            print(f"{shape:14} {T:>4} {cell['router_us']:>7.1f} {cell['fold_us']:>7.1f} "
                  f"{cell['unfold_us']:>7.1f} {cell['split_us']:>7.1f} {best or '-':>12} "
                  f"{timed.get(best, float('nan')):>7.1f} {dense_us or float('nan'):>7.1f} {share:>6}",
                  flush=True)
    write(args, rows)
    return 0


def write(args, rows: list[dict]) -> None:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sweep_split.json"), "w") as fh:
        json.dump(dict(provenance(dict(policy=DEFAULT_POLICY, shapes=args.shapes,
                                       tokens=args.tokens, variants=SPLIT_VARIANTS)), rows=rows),
                  fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())

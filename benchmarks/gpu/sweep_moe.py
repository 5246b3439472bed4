"""MoE layer launch structures and tiles on the GPU (issue 12): which one wins in each cell.

    python benchmarks/gpu/sweep_moe.py --out DIR [--shapes a,b] [--tokens 1,2,4,8,16,32,64]
        [--tile-tokens 1,8,16,64] [--budget-s 300]
For each shape, T and routing (dense top-k, and BASE at M=16, M=4 for E=8) it times fused_moe as
bench_fused_moe does (CUDA graph of 10 calls, median of 15 replays, 3 rotating weight copies):
    grouped   align -> up -> down -> combine                  4 launches, default tiles
    pair      pair-major (no align) -> combine                3          (T <= 4 only)
    one/one2  the whole layer in one persistent launch, 1 or 2 programs per SM (T <= 32)
then, for --tile-tokens, a coordinate search (BLOCK_M, up tiles, down tiles, grid order of each
GEMM; one launch: programs per SM, and last a register cap with the programs it lets fit, REGS) on
the faster structure. (An earlier version also timed the combine folded into the down GEMM
and an L2 prefetch of the down weights before the PDL wait: both measured slower or equal, and
were removed; benchmarks/results/kernels_h200_moe/README.md.) Every output is checked against the grouped default (rel. L2 < 1e-2) before it is
timed. Prints one line per cell; writes sweep_moe.json (every timing, the winners, provenance).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_fused_moe import COPIES, rotating  # noqa: E402
from kernel_common import (  # noqa: E402
    DEVICE,
    SHAPES,
    copy_bandwidth_gbs,
    graph_time_us,
    make_experts,
    make_routing,
    provenance,
)

from base_sglang.core import SelectionConfig  # noqa: E402
from base_sglang.kernels import base_select_experts, fused_moe  # noqa: E402
from base_sglang.kernels.fused_moe import MoeConfig, default_config  # noqa: E402
from base_sglang.kernels.moe_gemm import GemmConfig  # noqa: E402
from base_sglang.testing.predictors import random_predictor  # noqa: E402

UP = [GemmConfig(32, 128, 4, 4), GemmConfig(16, 128, 4, 4), GemmConfig(16, 256, 4, 3),
      GemmConfig(32, 64, 4, 5), GemmConfig(64, 128, 4, 3), GemmConfig(32, 256, 4, 3),
      GemmConfig(64, 64, 4, 4), GemmConfig(16, 64, 4, 6), GemmConfig(128, 64, 4, 4),
      GemmConfig(64, 64, 8, 5), GemmConfig(32, 128, 8, 4), GemmConfig(64, 128, 8, 3),
      # SGLang 0.5.23's H200 tiles for Qwen3 at 16-64 rows (its N counts gate + up columns)
      GemmConfig(32, 256, 4, 2), GemmConfig(32, 128, 4, 2), GemmConfig(64, 128, 4, 2),
      GemmConfig(128, 128, 8, 2)]
DOWN = [GemmConfig(64, 128, 4, 4), GemmConfig(32, 128, 4, 4), GemmConfig(128, 128, 4, 3),
        GemmConfig(64, 64, 4, 5), GemmConfig(64, 256, 4, 3), GemmConfig(32, 256, 4, 3),
        GemmConfig(128, 64, 4, 4), GemmConfig(16, 128, 4, 4), GemmConfig(32, 64, 4, 6),
        GemmConfig(128, 128, 8, 4),
        GemmConfig(64, 128, 4, 2), GemmConfig(64, 256, 4, 2), GemmConfig(128, 128, 4, 2),
        GemmConfig(256, 128, 8, 2)]


ONE_MAX_T = 32  # the one-launch structure is timed up to this T
# one-launch tiles: its start (call 2's winner, sixth session, Qwen3 T = 4-16, M = 16) and search
ONE_START = dict(ctas_per_sm=3, up=GemmConfig(64, 128, 4, 3), down=GemmConfig(128, 64, 4, 4))
ONE_UP = [GemmConfig(32, 128, 4, 4), GemmConfig(64, 128, 4, 3), GemmConfig(64, 64, 4, 4),
          GemmConfig(32, 256, 4, 3), GemmConfig(64, 128, 8, 3), GemmConfig(128, 64, 4, 3),
          GemmConfig(64, 256, 4, 2)]
ONE_DOWN = [GemmConfig(128, 64, 4, 4), GemmConfig(128, 128, 4, 4), GemmConfig(64, 128, 4, 4),
            GemmConfig(256, 64, 4, 4), GemmConfig(64, 256, 4, 4)]
# one launch, (maxnreg, programs per SM): Triton 3.6 compiles the tuned 4-warp tiles to 190-255
# registers, 2 programs per SM; 168 lets 3 fit, 128 lets 4 fit where shared memory allows
# (benchmarks/sass_count.py --moe --maxnreg)
REGS = [(0, 2), (168, 3), (128, 4)]


def structures(base: MoeConfig, T: int) -> dict[str, MoeConfig]:
    out = {"grouped": dataclasses.replace(base, pair_major=False, one_launch=False)}
    if T <= 4:
        out["pair"] = dataclasses.replace(base, pair_major=True, one_launch=False)
    if T <= ONE_MAX_T:
        one = dataclasses.replace(out["grouped"], one_launch=True)
        out["one"] = dataclasses.replace(one, **ONE_START)
        out["one2"] = dataclasses.replace(one, ctas_per_sm=2)
    return out


def short(cfg: dict) -> str:
    """bm/pm up(n,k,w,s,order) down(...) in one token, for the log."""
    def g(c):
        return f"{c['block_n']},{c['block_k']},{c['num_warps']},{c['num_stages']}{'n' if c['n_fast'] else 'b'}"
    one = f"O{cfg.get('ctas_per_sm', 1)}" if cfg.get("one_launch") else ""
    one += f"R{cfg['maxnreg']}" if cfg.get("one_launch") and cfg.get("maxnreg") else ""
    return f"bm{cfg['block_m']}{'P' if cfg['pair_major'] else ''}{one}/up{g(cfg['up'])}/dn{g(cfg['down'])}"


def candidates(stage: str, cfg: MoeConfig, pairs: int, n_read: int,
               max_rows: int = 0) -> list[MoeConfig]:
    """One coordinate of the tile search around cfg (one_launch: no grid order, programs per SM).
    max_rows: the pairs of the busiest expert (0: unknown), for the row-block stage."""
    if stage == "ctas":
        return [dataclasses.replace(cfg, ctas_per_sm=c) for c in (1, 2, 3, 4)
                if cfg.one_launch and c != cfg.ctas_per_sm]
    if stage == "regs":
        return [dataclasses.replace(cfg, maxnreg=r, ctas_per_sm=c) for r, c in REGS
                if cfg.one_launch and (r, c) != (cfg.maxnreg, cfg.ctas_per_sm)]
    if cfg.one_launch:  # one launch: no grid order; the up tiles' warps / stages are the launch's
        if stage == "up":
            return [dataclasses.replace(cfg, up=u) for u in ONE_UP if u != cfg.up]
        if stage == "down":
            return [dataclasses.replace(cfg, down=d) for d in ONE_DOWN
                    if (d.block_n, d.block_k) != (cfg.down.block_n, cfg.down.block_k)]
        if stage == "order":
            return []
    if stage == "bm":  # larger row blocks where the mean pairs per expert, or the busiest
        # expert's (skewed routing: one block instead of several re-reading its weights), fill them
        fill = max(2 * max(1, pairs // max(n_read, 1)), 2 * max_rows - 1)
        return [dataclasses.replace(cfg, block_m=bm) for bm in (32, 64)
                if not cfg.pair_major and bm <= fill]
    if stage == "up":
        return [dataclasses.replace(cfg, up=dataclasses.replace(u, n_fast=cfg.up.n_fast))
                for u in UP if (u.block_n, u.block_k, u.num_warps, u.num_stages)
                != (cfg.up.block_n, cfg.up.block_k, cfg.up.num_warps, cfg.up.num_stages)]
    if stage == "down":
        return [dataclasses.replace(cfg, down=dataclasses.replace(d, n_fast=cfg.down.n_fast))
                for d in DOWN if (d.block_n, d.block_k, d.num_warps, d.num_stages)
                != (cfg.down.block_n, cfg.down.block_k, cfg.down.num_warps, cfg.down.num_stages)]
    flip = dataclasses.replace  # grid order of each GEMM, then both
    return [flip(cfg, up=flip(cfg.up, n_fast=not cfg.up.n_fast)),
            flip(cfg, down=flip(cfg.down, n_fast=not cfg.down.n_fast)),
            flip(cfg, up=flip(cfg.up, n_fast=not cfg.up.n_fast),
                 down=flip(cfg.down, n_fast=not cfg.down.n_fast))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64")
    ap.add_argument("--tile-tokens", default="1,8,16,64")
    ap.add_argument("--structure", default="", help="tile-search this structure (e.g. one), "
                    "not the fastest")
    ap.add_argument("--routings", default="dense,budget", help="dense and/or budget (BASE M)")
    ap.add_argument("--budget-m", type=int, default=0, help="BASE budget M (default 16, 4 for E=8)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop starting new cells after this")
    args = ap.parse_args()
    t_start = time.monotonic()
    tile_tokens = {int(x) for x in args.tile_tokens.split(",") if x}
    bw = copy_bandwidth_gbs()
    result = {**provenance({"copies": COPIES, "timing": "CUDA graph of 10 calls, median of 15"}),
              "copy_bw_gbs": bw, "cells": []}
    path = os.path.join(args.out, "sweep_moe.json")
    os.makedirs(args.out, exist_ok=True)
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    for shape in args.shapes.split(","):
        s = SHAPES[shape]
        E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
        weights = [make_experts(E, H, I, seed=c) for c in range(COPIES)]
        gus, dns = [g for g, _ in weights], [d for _, d in weights]
        pred = random_predictor(E, H, K, seed=7, scale=0.02, bias_scale=0.1,
                                architecture="synthetic").to(DEVICE)
        m_base = args.budget_m or (16 if E > 16 else 4)
        for T in [int(x) for x in args.tokens.split(",")]:
            r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
            hidden = torch.randn(T, H, device=DEVICE).bfloat16()
            sel = base_select_experts(r.logits, r.ids, r.weights, hidden,
                                      torch.full((T,), m_base, device=DEVICE), 0,
                                      SelectionConfig(policy="base"), pred,
                                      norm_topk_prob=s["norm_topk_prob"])
            for label, ids, w in (("dense", r.ids, r.weights), (f"M={m_base}", sel.ids, sel.weights)):
                if ("dense" if label == "dense" else "budget") not in args.routings.split(","):
                    continue
                if time.monotonic() - t_start > args.budget_s:
                    print(f"budget of {args.budget_s:.0f} s reached: stopping", flush=True)
                    json.dump(result, open(path, "w"), indent=1)
                    return 0
                try:
                    n_read = int(torch.unique(ids[ids >= 0]).numel())
                    max_rows = int(torch.bincount(ids[ids >= 0].long().flatten(), minlength=E).max())
                    floor = n_read * 3 * H * I * 2 / (bw * 1e9) * 1e6
                    ref = fused_moe(hidden, ids, w, gus[0], dns[0], config=dataclasses.replace(
                        default_config(T, E, K), pair_major=False, one_launch=False)).float()

                    def timed(cfg, ids=ids, w=w, hidden=hidden, ref=ref, gus=gus, dns=dns):
                        try:  # a config that fails (e.g. a cooperative grid too large) is skipped
                            y = fused_moe(hidden, ids, w, gus[0], dns[0], config=cfg).float()
                            rel = ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()
                            if not rel < 1e-2:
                                raise RuntimeError(f"output differs from the grouped default: {rel:.2e}")
                            return graph_time_us(rotating(
                                lambda i: fused_moe(hidden, ids, w, gus[i], dns[i], config=cfg)))  # noqa: B023
                        except Exception as exc:  # noqa: BLE001
                            print(f"  {short(dataclasses.asdict(cfg))}: {type(exc).__name__}: "
                                  f"{str(exc)[:160]}", flush=True)
                            return float("inf")

                    base = default_config(T, E, K, None if label == "dense" else m_base)
                    times = {name: timed(cfg) for name, cfg in structures(base, T).items()}
                    best_name = min(times, key=times.get)
                    search = args.structure if args.structure in times else best_name
                    cell = dict(shape=shape, T=T, routing=label, experts_read=n_read,
                                floor_us=round(floor, 2), structures={k: round(v, 2) for k, v in times.items()},
                                best_structure=best_name)
                    if T in tile_tokens:
                        cfg = structures(base, T)[search]
                        best_t = times[search]
                        trials = []
                        for stage in ("bm", "order", "ctas", "up", "down", "order", "ctas", "regs"):
                            for c in candidates(stage, cfg, T * K, n_read, max_rows):
                                t = timed(c)
                                trials.append(dict(config=dataclasses.asdict(c), us=round(t, 2)))
                                if t < best_t:
                                    cfg, best_t = c, t
                        cell.update(tuned_us=round(best_t, 2), tuned=dataclasses.asdict(cfg),
                                    searched=search,
                                    tile_trials=trials)
                    result["cells"].append(cell)
                    best = min(cell.get("tuned_us", float("inf")), times[best_name])
                    print(f"{shape:14} T={T:<3} {label:6} read={n_read:<3} floor={floor:6.1f} "
                          + " ".join(f"{k}={v:.1f}" for k, v in times.items())
                          + f" | best {best:.1f} ({best / floor:.2f}x floor)"
                          + (f" {search} tuned {cell['tuned_us']:.1f}" if "tuned" in cell else "")
                          + (f" {short(cell['tuned'])}" if "tuned" in cell else ""), flush=True)
                except Exception:
                    traceback.print_exc()
                json.dump(result, open(path, "w"), indent=1)
        weights = gus = dns = None
        torch.cuda.empty_cache()
    json.dump(result, open(path, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

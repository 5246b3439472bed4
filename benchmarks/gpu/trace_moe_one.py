"""Where the one-launch MoE spends its time (issue 12, byte floor): its in-kernel timeline.

    python benchmarks/gpu/trace_moe_one.py --out DIR [--shapes a,b] [--tokens 4,8,16,32]
        [--budgets 8,16] [--variants shipped,up=32:128:4:4] [--trace-only shipped] [--budget-s 240]
For each shape, T and BASE budget M (ids from base_select_experts, policy base, random predictor,
as sweep_moe.py) it takes the shipped tuned config (kernels/configs; forced to the one-launch
structure when the row is not one), then for each variant ("shipped", or overrides of it joined by
"/": up=BN:BK:WARPS:STAGES, dn=BN:BK, c=CTAS per SM, r=MAXNREG registers per thread, u=UP_COLS
columns per up unit):
  - checks the output against the fp32 reference (rel. L2 < 1e-2) and run to run bitwise;
  - times it as sweep_moe.py does (CUDA graph of 10 calls, median of 15, 3 rotating weight copies);
  - traces one eager launch on a weight copy not touched by the previous launch: %globaltimer stamps
    per unit (start, after the wait / end of compute, end) and per program (start, after align, end).
The trace summary (us from the first program's start): programs' start spread, the align's end, the
last up unit's end, the first and last down unit's end of wait, the last unit's end (= the kernel's
span), mean up / down unit durations; the graph time minus the span is what launch and drain cost.
Prints a table; writes trace_moe_one.json (every cell, provenance, the raw traces of the Qwen3 T = 16 cells).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

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

from base_sglang.core import SelectionConfig, moe_forward_ref  # noqa: E402
from base_sglang.kernels import base_select_experts  # noqa: E402
from base_sglang.kernels.fused_moe import default_config, device_name  # noqa: E402
from base_sglang.kernels.moe_gemm import GemmConfig  # noqa: E402
from base_sglang.kernels.moe_one import moe_one, moe_one_units  # noqa: E402
from base_sglang.kernels.utils import num_sms  # noqa: E402
from base_sglang.testing.predictors import random_predictor  # noqa: E402


def parse_variant(v: str, cfg):
    """"shipped", or "up=BN:BK:W:S" / "dn=BN:BK" / "c=N" / "r=N" / "u=N" / "t=0|1|2" / "i=0|1" / "o=0|1"
    joined by "/" -> the config (i = idle_low: with fewer units than programs, the lowest ids idle;
    o = pair_order: on a 2-per-SM grid the programs alone on their SM walk first; o=1 clears i)."""
    for o in ([] if v == "shipped" else v.split("/")):
        key, _, val = o.partition("=")
        nums = [int(x) for x in val.split(":")] if val else []
        if key == "up" and len(nums) == 4:
            cfg = dataclasses.replace(cfg, up=GemmConfig(*nums))
        elif key == "dn" and len(nums) == 2:
            cfg = dataclasses.replace(cfg, down=dataclasses.replace(cfg.down, block_n=nums[0],
                                                                    block_k=nums[1]))
        elif key == "c" and len(nums) == 1:
            cfg = dataclasses.replace(cfg, ctas_per_sm=nums[0])
        elif key == "r" and len(nums) == 1 and 24 <= nums[0] <= 255:
            cfg = dataclasses.replace(cfg, maxnreg=nums[0])
        elif key == "u" and len(nums) == 1 and nums[0] % 8 == 0 and nums[0] > 0:
            cfg = dataclasses.replace(cfg, up_cols=nums[0])
        elif key == "t" and nums in ([0], [1], [2]):  # TMA tiles: t=1 all (up unit = BN1), t=2 down
            cfg = dataclasses.replace(cfg, tma=nums[0], up_cols=0 if nums[0] == 1 else cfg.up_cols)
        elif key == "i" and nums in ([0], [1]):  # fewer units than programs: the lowest ids idle
            cfg = dataclasses.replace(cfg, idle_low=nums[0])
        elif key == "o" and nums in ([0], [1]):  # pair_order: the programs alone on their SM first
            cfg = dataclasses.replace(cfg, pair_order=nums[0], idle_low=0 if nums[0] else cfg.idle_low)
        else:
            raise SystemExit(f"--variants: shipped, or up=BN:BK:WARPS:STAGES, dn=BN:BK, c=N, r=24..255, "
                             f"u=8k, t=0/1/2, i=0/1, o=0/1 joined by /, got {o!r} in {v!r}")
    return cfg


def one_kwargs(cfg, programs: int) -> dict:
    return dict(block_m=cfg.block_m, up=(cfg.up.block_n, cfg.up.block_k),
                down_tiles=(cfg.down.block_n, cfg.down.block_k), num_warps=cfg.up.num_warps,
                num_stages=cfg.up.num_stages, programs=programs, maxnreg=cfg.maxnreg or None,
                up_cols=cfg.up_cols or None, tma=cfg.tma, idle_low=bool(cfg.idle_low),
                pair_order=bool(cfg.pair_order))


def layout(n_act: int, H: int, I: int, cfg) -> tuple[int, int]:  # noqa: E741
    """(up units, all units) of a launch with n_act active experts."""
    nt1, nt2 = -(-I // (cfg.up_cols or cfg.up.block_n)), -(-H // cfg.down.block_n)
    return n_act * nt1, n_act * (nt1 + nt2)


def summarise(tr: torch.Tensor, units: int, u1: int, units_real: int) -> dict:
    """Times in us from the first program's start (see the module docstring): rows [0, u1) are
    the up units that ran, [u1, units_real) the down units, [units, ...) the programs. Column 3 of
    a unit's row is the SM it ran on: up_units_per_sm_max / sms_with_2_up say how evenly the
    hardware's placement of the programs spread the up units."""
    prog = tr[units:]
    prog = prog[prog[:, 0] > 0]  # the grid moe_one clamped to
    t0 = int(prog[:, 0].min())
    us = lambda v: round((int(v) - t0) / 1e3, 2)  # noqa: E731
    up, dn = tr[:u1], tr[u1:units_real]
    return dict(programs=int(prog.shape[0]), units=units_real, up_units=u1,
                start_spread_us=us(prog[:, 0].max()), align_done_us=us(prog[:, 1].max()),
                up_first_end_us=us(up[:, 2].min()), up_last_end_us=us(up[:, 2].max()),
                up_mean_us=round(float((up[:, 2] - up[:, 0]).double().mean()) / 1e3, 2),
                down_first_go_us=us(dn[:, 1].min()), down_last_go_us=us(dn[:, 1].max()),
                down_compute_mean_us=round(float((dn[:, 2] - dn[:, 1]).double().mean()) / 1e3, 2),
                span_us=us(prog[:, 2].max()), sms_used=int(torch.unique(prog[:, 3]).numel()),
                **_per_sm(up[:, 3]))


def _per_sm(sm: torch.Tensor) -> dict:
    """How the up units fell on the SMs (sm: the SM of each up unit)."""
    per = torch.bincount(sm.long()) if sm.numel() else torch.zeros(1, dtype=torch.long)
    return dict(up_units_per_sm_max=int(per.max()), sms_with_up=int((per > 0).sum()),
                sms_with_2_up=int((per >= 2).sum()))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="qwen3-30b-a3b,olmoe-1b-7b")
    ap.add_argument("--tokens", default="4,8,16,32")
    ap.add_argument("--budgets", default="8,16")
    ap.add_argument("--variants", default="shipped")
    ap.add_argument("--trace-only", default="", help="trace only these variants (default: all)")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting new cells after this")
    args = ap.parse_args()
    names = args.variants.split(",")
    for v in names:  # refuse a bad variant before any work
        parse_variant(v, default_config(16, 8, 2))
    t_start = time.monotonic()
    bw = copy_bandwidth_gbs()
    result = {**provenance({"copies": COPIES, "timing": "CUDA graph of 10 calls, median of 15",
                            "variants": args.variants}), "copy_bw_gbs": bw, "cells": []}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "trace_moe_one.json")
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    print(f"{'shape':14} {'T':>3} {'M':>3} {'read':>4} {'floor':>6} {'var':>18} {'us':>7} {'x fl':>5} "
          f"{'span':>6} {'align':>6} {'up end':>6} {'dn go':>6} {'up/u':>5} {'dn/u':>5}", flush=True)
    traced = set(args.trace_only.split(",")) if args.trace_only else set(names)
    for shape in args.shapes.split(","):
        s = SHAPES[shape]
        E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
        weights = [make_experts(E, H, I, seed=c) for c in range(COPIES)]
        gus, dns = [g for g, _ in weights], [d for _, d in weights]
        pred = random_predictor(E, H, K, seed=7, scale=0.02, bias_scale=0.1,
                                architecture="synthetic").to(DEVICE)
        for T in [int(x) for x in args.tokens.split(",")]:
            r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
            hidden = torch.randn(T, H, device=DEVICE).bfloat16()
            for M in [int(x) for x in args.budgets.split(",")]:
                if time.monotonic() - t_start > args.budget_s:
                    print(f"budget of {args.budget_s:.0f} s reached: stopping", flush=True)
                    json.dump(result, open(path, "w"), indent=1)
                    return 0
                sel = base_select_experts(r.logits, r.ids, r.weights, hidden,
                                          torch.full((T,), M, device=DEVICE), 0,
                                          SelectionConfig(policy="base"), pred,
                                          norm_topk_prob=s["norm_topk_prob"])
                ids, w = sel.ids, sel.weights
                n_read = int(torch.unique(ids[ids >= 0]).numel())
                floor = n_read * 3 * H * I * 2 / (bw * 1e9) * 1e6
                ref = moe_forward_ref(hidden.float(), ids.long(), w.float(), gus[0].float(),
                                      dns[0].float())
                shipped = default_config(T, E, K, M, hidden=H, inter=I, gpu=device_name(hidden.device))
                cfg = dataclasses.replace(shipped, one_launch=True, pair_major=False)
                if not shipped.one_launch:
                    cfg = dataclasses.replace(cfg, ctas_per_sm=max(cfg.ctas_per_sm, 3))
                for name in names:
                    vcfg = parse_variant(name, cfg)
                    kw = one_kwargs(vcfg, vcfg.ctas_per_sm * num_sms(hidden.device))
                    cell = dict(shape=shape, T=T, M=M, experts_read=n_read, floor_us=round(floor, 2),
                                variant=name, config=dataclasses.asdict(vcfg), kwargs=kw,
                                shipped_one_launch=shipped.one_launch)
                    try:
                        y = moe_one(hidden, ids, w, gus[0], dns[0], **kw)
                        rel = ((y.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
                        cell.update(rel_err=rel, repeat_bitwise=bool(torch.equal(
                            moe_one(hidden, ids, w, gus[0], dns[0], **kw), y)))
                        if not rel < 1e-2:
                            raise RuntimeError(f"output differs from the fp32 reference: {rel:.2e}")
                        t = graph_time_us(rotating(
                            lambda i, kw=kw: moe_one(hidden, ids, w, gus[i], dns[i], **kw)))  # noqa: B023
                        cell.update(us=round(t, 2), x_floor=round(t / floor, 3))
                        line = (f"{shape:14} {T:>3} {M:>3} {n_read:>4} {floor:6.1f} {name:>18} {t:7.1f} "
                                f"{t / floor:5.2f}")
                        if name in traced and DEVICE == "cuda":  # not in a dry run
                            units = moe_one_units(T, E, K, H, I, kw["up"], kw["down_tiles"], kw["up_cols"])
                            moe_one(hidden, ids, w, gus[2], dns[2], **kw)  # L2 holds copy 2
                            tr = trace_once(hidden, ids, w, gus[0], dns[0], kw, units)
                            u1, real = layout(n_read, H, I, vcfg)
                            g = cell["trace"] = summarise(tr, units, u1, real)
                            if shape.startswith("qwen3") and T == 16:  # every variant and M
                                raw = dict(shape=shape, T=T, M=M, variant=name, units=units,
                                           up_units=u1, ran=real, rows=tr.tolist())
                                result.setdefault("raw_trace", raw)  # the first, as before
                                result.setdefault("raw_traces", []).append(raw)
                            line += (f" {g['span_us']:6.1f} {g['align_done_us']:6.1f} "
                                     f"{g['up_last_end_us']:6.1f} {g['down_last_go_us']:6.1f} "
                                     f"{g['up_mean_us']:5.1f} {g['down_compute_mean_us']:5.1f}")
                        print(line + ("" if cell["repeat_bitwise"] else "  NOT BITWISE"), flush=True)
                    except Exception as exc:  # noqa: BLE001
                        cell["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                        print(f"{shape:14} {T:>3} {M:>3} {name}: {cell['error']}", flush=True)
                    result["cells"].append(cell)
                    json.dump(result, open(path, "w"), indent=1)
    by_cell: dict[tuple, dict[str, float]] = {}
    for c in result["cells"]:
        if "us" in c:
            by_cell.setdefault((c["shape"], c["T"], c["M"]), {})[c["variant"]] = c["us"]
    result["median_speedup_vs_first"] = {
        n: statistics.median([v[names[0]] / v[n] for v in by_cell.values() if names[0] in v and n in v]
                             or [float("nan")]) for n in names}
    json.dump(result, open(path, "w"), indent=1)
    print(f"median time({names[0]}) / time(variant): " + json.dumps(result["median_speedup_vs_first"]),
          flush=True)
    return 0


def trace_once(hidden, ids, w, gu, dn, kw: dict, units: int) -> torch.Tensor:
    """One eager launch with stamps: int64 [units + grid, 4], zeros where nothing ran."""
    tr = torch.zeros(units + kw["programs"], 4, dtype=torch.int64, device=hidden.device)
    moe_one(hidden, ids, w, gu, dn, trace=tr, **kw)
    torch.cuda.synchronize()
    return tr.cpu()


if __name__ == "__main__":
    sys.exit(main())

"""Per-layer budget schedule from calibrated layer sensitivity (policies base_sched / oracle_sched).

    python -m base_sglang.calibration.layer_schedule --model DIR --predictor FILE \
        --data base_sglang/data/heldout.txt --out STEM [--batch-size 16 --num-batches 3]

On the calibration split only (never the tune or report documents), it measures each MoE layer's
sensitivity curve: the mean per-token NLL increase when that layer alone runs base_plus at budget M
(every other layer dense), under the same batched teacher-forced decoding as base-eval, for M on a
grid (k/2 .. 6k). Then, for every batch budget M = 0..E, it spends the same total L * M experts per
step over the layers where they lower the summed curves most (exact dynamic programme; each curve is
made non-increasing and piecewise linear, 0 at M = E). Above --up-to (default 1.5k: where the
single-layer curves are still well above their noise; chosen on the tune split) every layer keeps M.
Writes STEM.safetensors (the predictor with the table `layer_budget` [L, E+1]) and STEM.json (curves,
table, command, commit). --curves STEM.json re-derives the table from curves measured before.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from base_sglang.calibration.config import run_cli
from base_sglang.calibration.data import (
    DEFAULT_EVAL_PERCENT,
    DEFAULT_TUNE_PERCENT,
    distinct_batches,
    read_documents,
    split_documents,
    tokenize_documents,
    windows,
)

UNIFORM_TIE = 1e-12  # per expert of distance from M: among equal sums the most uniform split wins


def curve_values(points: list[tuple[int, float]], num_experts: int, lo: int) -> np.ndarray:
    """Loss at every integer budget lo..E ([E - lo + 1]): linear between the measured (M, loss)
    points and (E, 0), non-increasing in M (a larger budget never costs more), and >= 0."""
    pts = sorted((int(m), max(0.0, float(v))) for m, v in points if lo <= m < num_experts)
    if not pts or pts[0][0] != lo:
        raise ValueError(f"curve: needs a measured point at the lowest budget {lo}, got {points}")
    xs = [m for m, _ in pts] + [num_experts]
    ys = [v for _, v in pts] + [0.0]
    vals = np.interp(np.arange(lo, num_experts + 1), xs, ys)  # [E - lo + 1]
    return np.minimum.accumulate(vals)


def allocate(curves: list[np.ndarray], num_experts: int, lo: int, m: int) -> list[int]:
    """Per-layer budgets M_l in [lo, E], sum = L * m, minimising sum_l curve_l(M_l) (exact DP).
    curves[l][i] = loss at budget lo + i. Below lo (or at m >= E) every layer gets m."""
    L = len(curves)
    if m < lo or m >= num_experts:
        return [m] * L
    total = L * m - L * lo  # experts to place above the floor lo
    width = num_experts - lo  # the most one layer can take above lo
    choice = np.arange(width + 1)  # [C] extra experts of one layer
    best = np.full(total + 1, np.inf)  # [S] min cost of the layers so far for each extra sum
    best[0] = 0.0
    picks = []
    for c in curves:
        cost = c[: width + 1] + UNIFORM_TIE * np.abs(lo + choice - m)  # [C]
        cand = np.full((total + 1, width + 1), np.inf)  # [S, C]
        for k in range(min(width, total) + 1):
            cand[k:, k] = best[: total + 1 - k] + cost[k]
        picks.append(np.argmin(cand, axis=1))  # [S] first minimum: the smaller extra
        best = cand[np.arange(total + 1), picks[-1]]
    out, s = [], total
    for p in reversed(picks):
        k = int(p[s])
        out.append(lo + k)
        s -= k
    return out[::-1]


def schedule_table(curves: dict[int, list[tuple[int, float]]], layers: list[int], num_experts: int,
                   lo: int, up_to: int | None = None) -> np.ndarray:
    """[L, E+1] table: column m = each layer's budget for batch budget m (same sum L * m); every
    layer gets m above up_to (None: no limit)."""
    vals = [curve_values(curves[layer], num_experts, lo) for layer in layers]
    table = np.zeros((len(layers), num_experts + 1))
    for m in range(num_experts + 1):
        scheduled = up_to is None or m <= up_to
        table[:, m] = allocate(vals, num_experts, lo, m) if scheduled else m
    return table


def default_grid(num_experts: int, top_k: int) -> list[int]:
    ms = {max(1, top_k // 2), top_k, round(1.5 * top_k), 2 * top_k, 3 * top_k, 4 * top_k, 6 * top_k}
    return sorted(m for m in ms if m < num_experts)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="layer_schedule", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--predictor", required=True, help="base-calibrate predictor file")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True, help="output stem (writes .safetensors and .json)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-batches", type=int, default=3)
    p.add_argument("--prefix", type=int, default=64)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--budgets", type=int, nargs="*", default=None,
                   help="grid of M (default k/2, k, 1.5k, 2k, 3k, 4k, 6k)")
    p.add_argument("--up-to", type=int, default=None,
                   help="largest batch budget that is scheduled (default round(1.5 k)); above it "
                        "every layer keeps M")
    p.add_argument("--curves", default=None,
                   help="a STEM.json of an earlier run: re-derive the table from its curves")
    p.add_argument("--threads", type=int, default=1)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli("layer_schedule", run, args)


def run(args) -> int:
    import torch

    from base_sglang.calibration.decode_eval import Setting, run_batch
    from base_sglang.core import Predictor, SelectionConfig
    from base_sglang.core.predictor import describe_model_config
    from base_sglang.hf import MoEPatch, load_model

    t0 = time.time()
    model, tokenizer = load_model(args.model, "cpu", "auto")
    predictor = Predictor.load(args.predictor)
    predictor.validate(model.config)
    desc = describe_model_config(model.config)
    E, K = int(desc["num_experts"]), int(desc["top_k"])
    layers = list(predictor.meta.moe_layers)
    grid = sorted(set(args.budgets)) if args.budgets else default_grid(E, K)
    if not grid or grid[0] < 1 or grid[-1] >= E:
        raise ValueError(f"budgets: must lie in 1..{E - 1}, got {grid}")
    up_to = round(1.5 * K) if args.up_to is None else args.up_to
    if args.curves:
        with open(args.curves) as f:
            old = json.load(f)
        curves = {int(k): [tuple(x) for x in v] for k, v in old["curves"].items()}
        if sorted(curves) != sorted(layers):
            raise ValueError(f"curves: {args.curves} covers layers {sorted(curves)}, the predictor "
                             f"{layers}")
        grid = old["meta"]["grid"]
        return _write(args, predictor, layers, curves, grid, up_to, E, K, t0,
                      {k: old["meta"][k] for k in ("batch_size", "num_batches", "prefix", "steps")}
                      | {"curves_from": args.curves, "curves_commit": old["meta"].get("commit")})
    docs = split_documents(read_documents(args.data), "calib", DEFAULT_EVAL_PERCENT,
                           DEFAULT_TUNE_PERCENT)
    wins = windows(tokenize_documents(tokenizer, docs), args.prefix + args.steps + 1)
    batches = distinct_batches(wins, args.batch_size, args.num_batches)
    if len(batches) < args.num_batches:
        raise ValueError(f"data: only {len(batches)} calibration batches of {args.batch_size}")
    batches = [torch.tensor([w for _, w in b], dtype=torch.long) for b in batches]
    dense_cfg = SelectionConfig(policy="dense")
    patch = MoEPatch(model, dense_cfg, predictor)
    dense_set = Setting("dense", "dense", "-", "-", dense_cfg, E)
    dense = [run_batch(model, patch, b, args.prefix, args.steps, dense_set) for b in batches]
    nll_d = -torch.cat([t.logp_target.reshape(-1) for t in dense]).double().mean()
    curves: dict[int, list[tuple[int, float]]] = {}
    for layer in layers:
        others = tuple(x for x in layers if x != layer)
        curves[layer] = []
        for m in grid:
            cfg = SelectionConfig(policy="base_plus", skip_layers=others)
            s = Setting(f"base_plus L{layer} M={m}", "base_plus", "M", m, cfg, m)
            tr = [run_batch(model, patch, b, args.prefix, args.steps, s) for b in batches]
            nll = -torch.cat([t.logp_target.reshape(-1) for t in tr]).double().mean()
            curves[layer].append((m, float(nll - nll_d)))
        print(f"layer {layer}: " + ", ".join(f"M={m} {v:+.4f}" for m, v in curves[layer]), flush=True)
    patch.remove()
    return _write(args, predictor, layers, curves, grid, up_to, E, K, t0,
                  {"batch_size": args.batch_size, "num_batches": len(batches), "prefix": args.prefix,
                   "steps": args.steps})


def _write(args, predictor, layers, curves, grid, up_to, E, K, t0, measured: dict) -> int:
    import torch

    from base_sglang.calibration.report import environment

    table = schedule_table(curves, layers, E, grid[0], up_to)
    predictor.layer_budget = torch.tensor(table, dtype=torch.float32)
    predictor.meta.calibration = dict(predictor.meta.calibration, layer_schedule={
        "split": "calib", "grid": grid, "up_to": up_to, **measured})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    predictor.save(out.with_suffix(".safetensors"))
    meta = {"model": Path(args.model).resolve().name, "predictor": Path(args.predictor).name,
            "command": "python -m base_sglang.calibration.layer_schedule " + " ".join(args.argv),
            "split": "calib", **measured, "grid": grid, "up_to": up_to, "num_experts": E, "top_k": K,
            "seconds": round(time.time() - t0, 1), **environment()}
    same = bool(args.curves) and Path(args.curves).resolve() == out.with_suffix(".json").resolve()
    if same:  # rebuilding the table of a measured run: keep its record (curves, command, commit)
        print(f"{out.with_suffix('.json')} kept (the curves were read from it)")
    with open(os.devnull if same else out.with_suffix(".json"), "w") as f:
        json.dump({"meta": meta, "curves": {str(k): v for k, v in curves.items()},
                   "table": {str(layer): [int(x) for x in table[j]] for j, layer in enumerate(layers)}},
                  f, indent=1)
    for m in grid:
        print(f"M={m}: " + " ".join(str(int(x)) for x in table[:, m]))
    print(f"wrote {out.with_suffix('.safetensors')}, {out.with_suffix('.json')} in "
          f"{time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

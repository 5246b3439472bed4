"""Per-layer budget schedule from calibrated layer sensitivity (policies base_sched / oracle_sched).

    python -m base_sglang.calibration.layer_schedule --model DIR --predictor FILE \
        --data base_sglang/data/heldout.txt --out STEM [--batch-size 16 --num-batches 3]
    ... --batch-sizes 8,16,64                     one table per batch-size range
    ... --curves A.json,B.json,C.json             re-derive the table(s) from curves measured before

On the calibration split only (never the tune or report documents), it measures each MoE layer's
sensitivity curve: the mean per-token NLL increase when that layer alone runs base_plus at budget M
(every other layer dense), under the same batched teacher-forced decoding as base-eval, for M on a
grid (k/2 .. 6k). Then, for every batch budget M = 0..E, it spends the same total L * M experts per
step over the layers where they lower the summed curves most (exact dynamic programme; each curve is
made non-increasing and piecewise linear, 0 at M = E). Above --up-to (default 1.5k: where the
single-layer curves are still well above their noise; chosen on the tune split) every layer keeps M.

With several batch sizes B_0 < B_1 < ... (--batch-sizes, or --curves files measured at different
batch sizes) it writes one table per batch-size range: range r serves steps of up to
max_batch[r] decode rows, by default the geometric midpoint floor(sqrt(B_r * B_{r+1})) (8,16,64 ->
rows 1-11, 12-32, 33+), the last range open-ended (--range-bounds sets them). The layers' sensitivity
depends on B (BENCHMARKS.md: the first layer dominates at B = 16, much less at B = 8).
Writes STEM.safetensors (the predictor with `layer_budget` [L, E+1], or [R, L, E+1] plus
`layer_budget_max_batch` [R-1]; core/predictor.py) and STEM.json (curves, tables, ranges, command,
commit). --curves re-derives the tables from the curves of earlier runs (their JSON files, single- or
multi-range).
"""

from __future__ import annotations

import argparse
import json
import math
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
from base_sglang.calibration.report import stem_path

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


def geometric_bounds(batch_sizes: list[int]) -> list[int]:
    """Upper bounds (inclusive) of all but the last range: floor(sqrt(B_r * B_{r+1})), which lies in
    [B_r, B_{r+1}) for ascending batch sizes."""
    return [math.isqrt(a * b) for a, b in zip(batch_sizes, batch_sizes[1:])]


def check_ranges(batch_sizes: list[int], bounds: list[int] | None) -> list[int]:
    """Validated range bounds for ascending calibration batch sizes (None: geometric midpoints);
    each calibrated batch size must lie inside its own range."""
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ValueError(f"batch-sizes: must be positive, got {batch_sizes}")
    if any(b >= c for b, c in zip(batch_sizes, batch_sizes[1:])):
        raise ValueError(f"batch-sizes: must be distinct and ascending, got {batch_sizes}")
    if bounds is None:
        return geometric_bounds(batch_sizes)
    if len(bounds) != len(batch_sizes) - 1:
        raise ValueError(f"range-bounds: needs {len(batch_sizes) - 1} bounds for batch sizes "
                         f"{batch_sizes} (the last range is open-ended), got {bounds}")
    for r, m in enumerate(bounds):
        if not batch_sizes[r] <= m < batch_sizes[r + 1]:
            raise ValueError(f"range-bounds: bound {m} of range {r} must lie in "
                             f"[{batch_sizes[r]}, {batch_sizes[r + 1]}) so that each calibrated "
                             f"batch size serves its own range")
    return list(bounds)


def _int_list(field: str):
    def parse(text: str) -> list[int]:
        try:
            vals = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{field}: comma-separated integers, got {text!r}") \
                from None
        if not vals:
            raise argparse.ArgumentTypeError(f"{field}: empty list")
        return vals
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="layer_schedule", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--predictor", required=True, help="base-calibrate predictor file")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True, help="output stem (writes .safetensors and .json)")
    bs = p.add_mutually_exclusive_group()
    bs.add_argument("--batch-size", type=int, default=None, help="one table, calibrated at B (16)")
    bs.add_argument("--batch-sizes", type=_int_list("batch-sizes"), default=None,
                    help="comma-separated ascending batch sizes: one table per batch-size range")
    p.add_argument("--num-batches", type=_int_list("num-batches"), default=None,
                   help="batches per batch size (one value, or one per --batch-sizes entry; "
                        "default max(1, round(48 / B)): 3 at B = 16)")
    p.add_argument("--range-bounds", type=_int_list("range-bounds"), default=None,
                   help="inclusive upper bounds of the decode rows of all but the last range "
                        "(default: geometric midpoints of the batch sizes)")
    p.add_argument("--prefix", type=int, default=64)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--budgets", type=int, nargs="*", default=None,
                   help="grid of M (default k/2, k, 1.5k, 2k, 3k, 4k, 6k)")
    p.add_argument("--up-to", type=int, default=None,
                   help="largest batch budget that is scheduled (default round(1.5 k)); above it "
                        "every layer keeps M")
    p.add_argument("--curves", default=None,
                   help="comma-separated STEM.json files of earlier runs: re-derive the table(s) "
                        "from their curves (one range per batch size)")
    p.add_argument("--threads", type=int, default=1)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli("layer_schedule", run, args)


def read_curves(path: str, layers: list[int]) -> list[dict]:
    """The measured ranges of a layer_schedule JSON (single- or multi-range): [{batch_size,
    num_batches, prefix, steps, grid, curves {layer: [(M, loss)]}, curves_from, curves_commit}]."""
    with open(path) as f:
        old = json.load(f)
    entries = old.get("ranges") or [dict(old["meta"], curves=old["curves"])]
    out = []
    for e in entries:
        curves = {int(k): [tuple(x) for x in v] for k, v in e["curves"].items()}
        if sorted(curves) != sorted(layers):
            raise ValueError(f"curves: {path} covers layers {sorted(curves)}, the predictor {layers}")
        out.append({k: e[k] for k in ("batch_size", "num_batches", "prefix", "steps", "grid")}
                   | {"curves": curves, "curves_from": path,
                      "curves_commit": e.get("curves_commit") or old["meta"].get("commit")})
    return out


def run(args) -> int:
    import torch

    from base_sglang.core import Predictor
    from base_sglang.core.predictor import describe_model_config
    from base_sglang.hf import load_model

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
        if args.batch_size is not None or args.batch_sizes is not None:
            raise ValueError("batch-sizes: not with --curves (the curve files record their own)")
        ranges = [r for path in args.curves.split(",") if path.strip()
                  for r in read_curves(path.strip(), layers)]
        ranges.sort(key=lambda r: r["batch_size"])
        bounds = check_ranges([r["batch_size"] for r in ranges], args.range_bounds)
        return _write(args, predictor, layers, ranges, bounds, up_to, E, K, t0)
    sizes = args.batch_sizes or [16 if args.batch_size is None else args.batch_size]
    bounds = check_ranges(sizes, args.range_bounds)
    counts = args.num_batches or [max(1, round(48 / b)) for b in sizes]
    if len(counts) == 1:
        counts = counts * len(sizes)
    if len(counts) != len(sizes) or any(n < 1 for n in counts):
        raise ValueError(f"num-batches: needs one positive value or one per batch size {sizes}, "
                         f"got {counts}")
    docs = split_documents(read_documents(args.data), "calib", DEFAULT_EVAL_PERCENT,
                           DEFAULT_TUNE_PERCENT)
    wins = windows(tokenize_documents(tokenizer, docs), args.prefix + args.steps + 1)
    ranges = []
    for b, n in zip(sizes, counts):
        batches = distinct_batches(wins, b, n)
        if len(batches) < n:
            raise ValueError(f"data: only {len(batches)} calibration batches of {b}")
        batches = [torch.tensor([w for _, w in x], dtype=torch.long) for x in batches]
        print(f"B={b}: {len(batches)} batches", flush=True)
        curves = measure_curves(model, predictor, layers, grid, batches, args.prefix, args.steps, E)
        ranges.append({"batch_size": b, "num_batches": len(batches), "prefix": args.prefix,
                       "steps": args.steps, "grid": grid, "curves": curves})
    return _write(args, predictor, layers, ranges, bounds, up_to, E, K, t0)


def measure_curves(model, predictor, layers, grid, batches, prefix, steps, E):
    """{layer: [(M, mean NLL increase with only this layer under base_plus at M)]} on `batches`."""
    import torch

    from base_sglang.calibration.decode_eval import Setting, run_batch
    from base_sglang.core import SelectionConfig
    from base_sglang.hf import MoEPatch

    dense_cfg = SelectionConfig(policy="dense")
    patch = MoEPatch(model, dense_cfg, predictor)
    try:
        dense_set = Setting("dense", "dense", "-", "-", dense_cfg, E)
        dense = [run_batch(model, patch, b, prefix, steps, dense_set) for b in batches]
        nll_d = -torch.cat([t.logp_target.reshape(-1) for t in dense]).double().mean()
        curves: dict[int, list[tuple[int, float]]] = {}
        for layer in layers:
            others = tuple(x for x in layers if x != layer)
            curves[layer] = []
            for m in grid:
                cfg = SelectionConfig(policy="base_plus", skip_layers=others)
                s = Setting(f"base_plus L{layer} M={m}", "base_plus", "M", m, cfg, m)
                tr = [run_batch(model, patch, b, prefix, steps, s) for b in batches]
                nll = -torch.cat([t.logp_target.reshape(-1) for t in tr]).double().mean()
                curves[layer].append((m, float(nll - nll_d)))
            print(f"layer {layer}: " + ", ".join(f"M={m} {v:+.4f}" for m, v in curves[layer]),
                  flush=True)
    finally:
        patch.remove()
    return curves


def _write(args, predictor, layers, ranges, bounds, up_to, E, K, t0) -> int:
    import torch

    from base_sglang.calibration.report import environment

    tables = [schedule_table(r["curves"], layers, E, r["grid"][0], up_to) for r in ranges]  # [L, E+1]
    if len(ranges) == 1:  # one table: the [L, E+1] format every reader knows
        predictor.layer_budget = torch.tensor(tables[0], dtype=torch.float32)
        predictor.layer_budget_max_batch = None
    else:
        predictor.layer_budget = torch.tensor(np.stack(tables), dtype=torch.float32)  # [R, L, E+1]
        predictor.layer_budget_max_batch = torch.tensor(bounds, dtype=torch.float32)
    predictor._check_schedule()
    lows = [1] + [m + 1 for m in bounds]
    records = [{k: v for k, v in r.items() if k != "curves"}
               | {"min_batch": lo, "max_batch": bounds[i] if i < len(bounds) else None}
               for i, (r, lo) in enumerate(zip(ranges, lows))]
    predictor.meta.calibration = dict(predictor.meta.calibration, layer_schedule={
        "split": "calib", "up_to": up_to,
        **({k: v for k, v in records[0].items() if k not in ("min_batch", "max_batch")}
           if len(ranges) == 1 else {"ranges": records})})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    predictor.save(stem_path(out, ".safetensors"))
    env = {"model": Path(args.model).resolve().name, "predictor": Path(args.predictor).name,
           "command": "python -m base_sglang.calibration.layer_schedule " + " ".join(args.argv),
           "split": "calib"}
    tail = {"up_to": up_to, "num_experts": E, "top_k": K, "seconds": round(time.time() - t0, 1),
            **environment()}

    def table_json(t):
        return {str(layer): [int(x) for x in t[j]] for j, layer in enumerate(layers)}

    if len(ranges) == 1:  # the single-range layout of the committed q3 files
        r = ranges[0]
        doc = {"meta": env | {k: r[k] for k in ("batch_size", "num_batches", "prefix", "steps")}
               | ({"curves_from": r["curves_from"], "curves_commit": r["curves_commit"]}
                  if "curves_from" in r else {}) | {"grid": r["grid"]} | tail,
               "curves": {str(k): v for k, v in r["curves"].items()}, "table": table_json(tables[0])}
    else:
        doc = {"meta": env | {"batch_sizes": [r["batch_size"] for r in ranges],
                              "range_max_batch": bounds} | tail,
               "ranges": [rec | {"curves": {str(k): v for k, v in r["curves"].items()},
                                 "table": table_json(t)}
                          for rec, r, t in zip(records, ranges, tables)]}
    sources = {str(Path(r["curves_from"]).resolve()) for r in ranges if "curves_from" in r}
    same = str(stem_path(out, ".json").resolve()) in sources
    if same:  # rebuilding the table of a measured run: keep its record (curves, command, commit)
        print(f"{stem_path(out, '.json')} kept (the curves were read from it)")
    with open(os.devnull if same else stem_path(out, ".json"), "w") as f:
        json.dump(doc, f, indent=1)
    for rec, r, t in zip(records, ranges, tables):
        rows = f"{rec['min_batch']}-{rec['max_batch'] if rec['max_batch'] is not None else ''}"
        head = f"B={r['batch_size']} (rows {rows}) " if len(ranges) > 1 else ""
        for m in r["grid"]:
            if m <= up_to:
                print(f"{head}M={m}: " + " ".join(str(int(x)) for x in t[:, m]))
    print(f"wrote {stem_path(out, '.safetensors')}, {stem_path(out, '.json')} in "
          f"{time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

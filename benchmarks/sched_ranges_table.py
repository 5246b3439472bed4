"""Issue 13: base_sched with one table per batch-size range vs one B = 16 table vs base_plus.

    python benchmarks/sched_ranges_table.py --out STEM REF.json:NEW.json [REF.json:NEW.json ...]

REF is a merged report of the q3 runs (base_plus and base_sched with the single B = 16 table, same
windows), NEW a base-eval run of base_sched / oracle_sched with the multi-range predictor file (or
another table: --label names it) on the same windows (the files must agree on model, batch size and dense NLL). Differences are in the
per-token NLL increase; "*" marks |diff| > 2 sqrt(se_a^2 + se_b^2) (the reports' two-SE rule).
Prints a markdown table and writes STEM.csv / STEM.json (no recomputation: rows of the files).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path


def _rows(res: dict) -> dict[tuple[str, int], dict]:
    return {(r["policy"], r["value"]): r for r in res["rows"] if r.get("knob") == "M"}


def _dense(res: dict) -> float:
    return next(r["nll"] for r in res["rows"] if r["policy"] == "dense")


def _diff(a: dict | None, b: dict | None) -> dict | None:
    """a - b in dnll and relative ppl-increase, with the two-SE flag."""
    if a is None or b is None:
        return None
    d = a["dnll"] - b["dnll"]
    se = math.sqrt(a["dnll_se"] ** 2 + b["dnll_se"] ** 2)
    rel = 100 * (a["dppl_pct"] / b["dppl_pct"] - 1) if b["dppl_pct"] > 0 else float("nan")
    return {"dnll": d, "two_se": 2 * se, "significant": abs(d) > 2 * se, "rel_pct": rel}


def compare(ref: dict, new: dict) -> list[dict]:
    for key in ("model", "num_experts", "top_k"):
        if ref["meta"][key] != new["meta"][key]:
            raise ValueError(f"{key}: the files differ ({ref['meta'][key]} vs {new['meta'][key]})")
    b_ref, b_new = ref["meta"]["settings"]["batch_size"], new["meta"]["settings"]["batch_size"]
    if b_ref != b_new:
        raise ValueError(f"batch_size: the files differ ({b_ref} vs {b_new})")
    if abs(_dense(ref) - _dense(new)) > 1e-9:
        raise ValueError("dense nll: the files did not score the same windows / versions")
    r_ref, r_new = _rows(ref), _rows(new)
    out = []
    for (policy, m), s in sorted(r_new.items()):
        if policy != "base_sched":
            continue
        plus, single = r_ref.get(("base_plus", m)), r_ref.get(("base_sched", m))
        oracle = r_new.get(("oracle_sched", m))
        out.append({"model": ref["meta"]["model"], "batch_size": b_new, "M": m,
                    "top_k": ref["meta"]["top_k"],
                    "base_plus": plus and plus["dppl_pct"],
                    "sched_b16": single and single["dppl_pct"],
                    "sched_ranges": s["dppl_pct"], "oracle_sched_ranges": oracle and oracle["dppl_pct"],
                    "experts_ranges": s["experts"],
                    "ranges_vs_plus": _diff(s, plus), "b16_vs_plus": _diff(single, plus),
                    "ranges_vs_b16": _diff(s, single),
                    "new_file_commit": new["meta"].get("commit")})
    return out


def _cell(x: float | None) -> str:
    return "-" if x is None else (f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}")


def _dcell(d: dict | None) -> str:
    if d is None:
        return "-"
    return f"{d['rel_pct']:+.1f} %" + (" *" if d["significant"] else "") + f" ({d['dnll']:+.4f} ± {d['two_se']:.4f})"


def markdown(rows: list[dict], new: str = "ranges") -> str:
    out = [f"| model | B | M | base_plus | base_sched, B=16 table | base_sched, {new} | oracle_sched, {new} "
           f"| B=16 table vs base_plus | {new} vs base_plus | {new} vs B=16 table |",
           "|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        label = f"{r['M']}" + (" (< k)" if r["M"] < r["top_k"] else "")
        out.append(f"| {r['model']} | {r['batch_size']} | {label} | {_cell(r['base_plus'])} | "
                   f"{_cell(r['sched_b16'])} | {_cell(r['sched_ranges'])} | "
                   f"{_cell(r['oracle_sched_ranges'])} | {_dcell(r['b16_vs_plus'])} | "
                   f"{_dcell(r['ranges_vs_plus'])} | {_dcell(r['ranges_vs_b16'])} |")
    return "\n".join(out) + ("\n\nperplexity increase in %; differences: relative change of the increase, * = "
                             "more than two standard errors (dnll difference ± 2 SE, nats per token)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sched_ranges_table", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output stem (.csv, .json)")
    p.add_argument("--label", default="ranges", help="what NEW's predictor file holds (column names)")
    p.add_argument("pairs", nargs="+", help="REF.json:NEW.json")
    args = p.parse_args(argv)
    rows = []
    for pair in args.pairs:
        if pair.count(":") != 1:
            p.error(f"pairs: expected REF.json:NEW.json, got {pair!r}")
        ref, new = pair.split(":")
        try:
            rows += compare(json.loads(Path(ref).read_text()), json.loads(Path(new).read_text()))
        except (ValueError, FileNotFoundError) as e:
            p.error(f"{pair}: {e}")
    print(markdown(rows, args.label))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"pairs": args.pairs, "rows": rows}, indent=1))
    flat = ("model", "batch_size", "M", "base_plus", "sched_b16", "sched_ranges", "oracle_sched_ranges",
            "experts_ranges")
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*flat, *(f"{k}_{x}" for k in ("ranges_vs_plus", "b16_vs_plus", "ranges_vs_b16")
                             for x in ("dnll", "two_se", "significant"))])
        for r in rows:
            w.writerow([r[k] for k in flat] + [(r[k] or {}).get(x) for k in
                                               ("ranges_vs_plus", "b16_vs_plus", "ranges_vs_b16")
                                               for x in ("dnll", "two_se", "significant")])
    return 0


if __name__ == "__main__":
    sys.exit(main())

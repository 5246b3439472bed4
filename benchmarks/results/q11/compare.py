"""base_plus rows of several base-eval runs (same split, same B) side by side at each M.

    python benchmarks/results/q11/compare.py FIRST.json OTHER.json...

Cell: ppl increase % (its dnll_se), then for every file but the first the difference of the mean NLL
increase to the first file's in units of the combined SE sqrt(se_a^2 + se_b^2) (unpaired, BENCHMARKS'
two-standard-error rule)."""

import json
import math
import sys


def cell(r, b, first):
    text = f"{r['dppl_pct']:.3g} ({r['dnll_se']:.4f})"
    if first:
        return text
    se = math.sqrt(r["dnll_se"] ** 2 + b["dnll_se"] ** 2)
    return text + (f" {(r['dnll'] - b['dnll']) / se:+.2f}" if se > 0 else "")


def main(paths):
    runs = [json.load(open(p)) for p in paths]
    rows = [{r["value"]: r for r in d["rows"] if r["policy"] == "base_plus"} for d in runs]
    taus = [d["meta"]["settings"].get("backfill_min_share", 0.0) for d in runs]
    print("| M | experts | " + " | ".join(f"tau={t:g}" for t in taus) + " |")
    print("|" + "---:|" * (2 + len(runs)))
    for m, b in sorted(rows[0].items()):
        cells = [cell(r[m], b, i == 0) if m in r else "-" for i, r in enumerate(rows)]
        print(f"| {m} | {b['experts']:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])

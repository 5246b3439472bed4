"""Markdown tables of BENCHMARKS.md's kernel section from a results folder.

    python benchmarks/kernel_tables.py select|align DIR
select: bench_base_select.py's base_select.json (selection latency per launch variant, share of the
        dense MoE layer); align: bench_fused_moe.py's fused_moe.json rows with SGLang's align timed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def select_table(rows: list[dict]) -> str:
    """One row per (shape, T); "by the rule" = the kernel base_select_experts picks for that shape
    now (kernels.select_experts.selection_kernel), with that kernel's measured time and share."""
    from base_sglang.kernels.select_experts import FUSED_MAX_T, FUSED_MIN_E

    experts = {"qwen3-30b-a3b": 128, "olmoe-1b-7b": 64, "mixtral-8x7b": 8}
    out = ["| shape | T | empty launch µs | two launches µs | fused µs | fused, plain launch µs | "
           "torch core µs | dense MoE µs | by the rule | its µs | its share |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        fused = r["T"] <= FUSED_MAX_T and experts[r["shape"]] >= FUSED_MIN_E
        us = r["fused_us"] if fused else r["two_us"]
        out.append(f"| {r['shape']} | {r['T']} | {r['empty_us']:.1f} | {r['two_us']:.1f} | "
                   f"{r['fused_us']:.1f} | {r['fused_nocoop_us']:.1f} | {r['torch_us']:.0f} | "
                   f"{r['dense_moe_us']:.1f} | {'fused' if fused else 'two'} | {us:.1f} | "
                   f"{us / r['dense_moe_us']:.1%} |")
    return "\n".join(out)


def align_table(rows: list[dict]) -> str:
    out = ["| shape | T | M | experts read | ours µs | SGLang µs (align outside) | "
           "SGLang µs (its align inside) | ours / SGLang with align |",
           "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "sglang_align_us" not in r:
            continue
        out.append(f"| {r['shape']} | {r['T']} | {r['M']} | {r['experts_read']} | "
                   f"{r['ours_us']:.1f} | {r['sglang_us']:.1f} | {r['sglang_align_us']:.1f} | "
                   f"{r['ours_over_sglang_align']:.2f} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("select", "align"))
    ap.add_argument("folder", help="a results folder with base_select.json / fused_moe.json")
    args = ap.parse_args()
    kind = args.kind
    path = os.path.join(args.folder, {"select": "base_select.json", "align": "fused_moe.json"}[kind])
    if not os.path.isfile(path):
        ap.error(f"folder: no {os.path.basename(path)} in {args.folder}")
    with open(path) as f:
        rows = json.load(f)["rows"]
    print(select_table(rows) if kind == "select" else align_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

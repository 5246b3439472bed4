"""base_plus's combine exponent alpha per budget: does a budget- or model-dependent alpha win?

    python -m research.alpha_scan --model base_sglang/models/proxy-moe \
        --predictor base_sglang/models/proxy-moe/predictor.safetensors \
        --out benchmarks/results/q15/alpha_proxy_b16 --split tune --num-batches 2 \
        --budgets 8 16 32 --alphas 0 0.25 0.5 0.75 1

RESEARCH CODE, not a serving path. base_plus combines a token's kept weights as
w_never * (W / sum w_never) ** alpha (core.selection; alpha = SelectionConfig.renorm_alpha, 0.5 by
default, tuned once on the `tune` split). This runs base-eval's batched teacher-forced decoding
(same batches, prefix, steps, dense prefill) for base_plus and oracle_plus (true norms, same combine
rule) at every (alpha, M), plus any --extra policies at the default alpha, and writes OUT.json: per
setting the perplexity increase over dense, the mean per-token NLL increase and its standard error,
and the paired per-token NLL difference to the same setting at --ref-alpha (0.5) with its standard error.
`python -m research.alpha_scan table OUT.json` prints it as a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from research.ppl_common import (
    add_eval_args,
    commit,
    eval_batches,
    finish_args,
    load_setup,
    mean_se,
    write_json,
)


def run(args) -> int:
    from base_sglang.calibration.decode_eval import run_batch
    from base_sglang.calibration.sweep import build_settings
    from base_sglang.hf import MoEPatch

    t0, start_commit = time.time(), commit()  # the code that runs (HEAD may move during a long run)
    model, tok, pred, E, K, H = load_setup(args)
    batches = eval_batches(tok, args.data, args.batch_size, args.num_batches, args.prefix, args.steps,
                           args.split)
    dense_s = build_settings([], E, K, [])[0]
    patch = MoEPatch(model, dense_s.config, pred)
    dense = torch.stack([-run_batch(model, patch, b, args.prefix, args.steps, dense_s).logp_target
                         for b in batches])  # [batches, steps, B] dense NLL
    plan = [(a, s) for a in args.alphas
            for s in build_settings(args.policies.split(","), E, K, args.budgets, renorm_alpha=a)[1:]]
    plan += [(0.5, s) for s in build_settings(args.extra, E, K, args.budgets)[1:]] if args.extra else []
    rows, nlls = [], {}
    for a, s in plan:
        nll = torch.stack([-run_batch(model, patch, b, args.prefix, args.steps, s).logp_target
                           for b in batches])  # [batches, steps, B]
        nlls[(s.name, a)] = nll
        dnll, dnll_se = mean_se(nll - dense)  # per-token NLL increase
        rows.append({"policy": s.policy, "name": s.name, "alpha": a, "M": s.value,
                     "ppl_increase_pct": round(float(torch.exp(nll.mean() - dense.mean()) - 1) * 100, 4),
                     "dnll": dnll, "dnll_se": dnll_se})
        print(f"alpha={a:<5} {s.name:18s} {rows[-1]['ppl_increase_pct']:9.3f} %  "
              f"dnll {rows[-1]['dnll']:.4f} +- {rows[-1]['dnll_se']:.4f}", flush=True)
    for r in rows:  # paired against the same setting at --ref-alpha (same tokens)
        ref = nlls.get((r["name"], args.ref_alpha))
        if ref is not None:
            r["paired_vs_ref"], r["paired_vs_ref_se"] = mean_se(nlls[(r["name"], r["alpha"])] - ref)
    patch.remove()
    meta = {"command": "python -m research.alpha_scan " + " ".join(args.argv), "commit": start_commit,
            "model": Path(args.model).name, "split": args.split, "batch_size": args.batch_size,
            "num_batches": len(batches), "prefix": args.prefix, "steps": args.steps,
            "ref_alpha": args.ref_alpha, "torch": torch.__version__, "seconds": round(time.time() - t0, 1)}
    out = write_json(args.out, meta, rows)
    print(table(str(out)))
    print(f"wrote {out} in {meta['seconds']:.0f} s")
    return 0


def _z(r: dict) -> str:
    """' (z +1.2)': the paired NLL difference to the reference alpha in its standard errors."""
    se = r.get("paired_vs_ref_se")
    return f" (z {r['paired_vs_ref'] / se:+.1f})" if se else ""


def table(path: str) -> str:
    """OUT.json -> markdown: per (policy, M) the perplexity increase (%) at each alpha, bold = the
    lowest, z = the paired difference to the same setting at the reference alpha in standard errors."""
    rows = json.loads(Path(path).read_text())["rows"]
    alphas = sorted({r["alpha"] for r in rows})
    out = ["| policy | M | " + " | ".join(f"alpha = {a:g}" for a in alphas) + " |",
           "|---|---:|" + "---:|" * len(alphas)]
    for pol in dict.fromkeys(r["name"].split(" ")[0] for r in rows):
        for m in dict.fromkeys(r["M"] for r in rows if r["name"].startswith(pol + " ")):
            cells = {r["alpha"]: r for r in rows if r["name"] == f"{pol} M={m}"}
            best = min(cells.values(), key=lambda r: r["dnll"])
            out.append(f"| {pol} | {m} | " + " | ".join(
                "-" if a not in cells else (("**%.2f**" if cells[a] is best else "%.2f")
                                            % cells[a]["ppl_increase_pct"]) + _z(cells[a])
                for a in alphas) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["table"]:  # python -m research.alpha_scan table OUT.json
        print(table(argv[1]))
        return 0
    ap = argparse.ArgumentParser(prog="alpha_scan", description=__doc__.split("\n\n")[0])
    add_eval_args(ap)
    from base_sglang.calibration.data import SPLITS

    ap.add_argument("--split", default="tune", choices=SPLITS)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    ap.add_argument("--policies", default="base_plus,oracle_plus", help="scanned over every alpha")
    ap.add_argument("--ref-alpha", type=float, default=0.5,
                    help="each row's paired NLL difference is against this alpha's same setting")
    ap.add_argument("--extra", nargs="*", default=[], help="more policies at the default alpha (e.g. base)")
    args = ap.parse_args(argv)
    args.argv = argv
    if any(not 0.0 <= a <= 1.0 for a in args.alphas):
        ap.error(f"--alphas: each in [0, 1], got {args.alphas}")
    finish_args(ap, args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

"""On-policy calibration: refit the log-norm predictor on the decode trajectories that BASE itself
produces, and compare base_plus with it to the shipped (dense-fitted) predictor.

    python -m research.onpolicy_fit --model base_sglang/models/proxy-moe \
        --predictor base_sglang/models/proxy-moe/predictor.safetensors \
        --out benchmarks/results/q15/onpolicy_fit_proxy_b16 --collect-budgets 8 12 16 \
        --budgets 8 12 16 24 32 48

RESEARCH CODE, not a serving path. research/onpolicy_r2.py shows the predictor's R^2 falling on the
pruned trajectory at small M. Here the fit rows come from base-eval-style batched decoding of the
CALIBRATION split (dense prefill of `prefix` tokens, then `steps` decode steps of B rows):
  refit_dense     prefill rows + the dense run's decode rows (counted once per collect budget),
  refit_onpolicy  prefill rows + the decode rows of base_plus (driven by the shipped predictor) at
                  each --collect-budgets M,
and with --with-calib-rows instead calib+dense / calib+onpolicy: the same plus base-calibrate's own
fit rows (dense forwards of its fit windows, CalibrationConfig defaults),
each a per-(layer, expert) ridge of y = log(||E_u(z)|| + 1e-6) on z for the model's own top-k pairs
(calibration.collect.LayerStats + calibration.fit.fit_ridge, ridge 1e-3 as base-calibrate). The
refit predictors keep every other tensor of the shipped file. Then base-eval's decoding of --split
(default tune) scores base_plus under shipped / refit_dense / refit_onpolicy and oracle_plus at
--budgets, and OUT.json holds per (predictor, M) the perplexity increase, the NLL increase and its SE,
and the paired NLL difference to base_plus with the shipped predictor (same tokens).
`python -m research.onpolicy_fit table OUT.json` prints the table.

Shape legend: T tokens of one forward, K routed slots, E experts, H hidden size.
"""

from __future__ import annotations

import argparse
import dataclasses
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


def collect(model, patch, blocks, batches, prefix, steps, settings_and_repeats, E, H, calib_windows=()):
    """LayerStats per layer over the prefill rows (once), the decode rows of each (setting, repeat),
    and the dense forwards of calib_windows (base-calibrate's fit windows, [n, seq_len] each)."""
    from base_sglang.calibration.collect import LayerStats, run_forward
    from base_sglang.calibration.decode_eval import run_batch

    stats = {j: LayerStats(E, H, sere_tokens=0) for j in blocks}
    state = {"decode_repeat": 0, "prefill": True}

    def make(j, block):
        def hook(module, hook_args, output):
            x = hook_args[0].reshape(-1, hook_args[0].shape[-1])  # [T, H]
            decode = x.shape[0] == batches[0].shape[0]  # T = B rows: a decode step
            n = state["decode_repeat"] if decode else int(state["prefill"])
            if n:
                _, _, ids = type(module).forward(module, x)  # the model's own top-k (unpatched)
                ids = ids.reshape(x.shape[0], -1)  # [T, K]
                for _ in range(n):
                    stats[j].update(x, ids, block.experts)
            return None

        return hook

    handles = [b.gate.register_forward_hook(make(j, b)) for j, b in blocks.items()]
    try:
        for w in calib_windows:  # outside a decode step every block runs dense
            run_forward(model, w)  # T = rows * seq_len: counted as "prefill" rows
        for i, (s, repeat) in enumerate(settings_and_repeats):
            # the prefill rows once (the first setting's: the prefill is dense under every setting)
            state["decode_repeat"], state["prefill"] = repeat, i == 0
            for b in batches:
                run_batch(model, patch, b, prefix, steps, s)
    finally:
        for h in handles:
            h.remove()
    return stats


def refit(pred, stats, ridge: float, tag: str):
    from base_sglang.calibration.fit import fit_ridge

    w, b = pred.weight.clone(), pred.bias.clone()
    fit = {}
    for j, st in stats.items():
        slot = pred.slot(j)
        w[slot], b[slot], s = fit_ridge(st, ridge)
        fit[str(j)] = {k: round(v, 4) for k, v in s.items()}
    meta = dataclasses.replace(pred.meta, calibration={**pred.meta.calibration, "research_refit": tag})
    return dataclasses.replace(pred, meta=meta, weight=w, bias=b), fit


def run(args) -> int:
    from base_sglang.calibration.decode_eval import run_batch
    from base_sglang.calibration.sweep import build_settings
    from base_sglang.hf import MoEPatch

    t0, start_commit = time.time(), commit()  # the code that runs (HEAD may move during a long run)
    model, tok, shipped, E, K, H = load_setup(args)
    calib = eval_batches(tok, args.data, args.batch_size, args.collect_batches, args.prefix, args.steps,
                         "calib")
    dense_s = build_settings([], E, K, [])[0]
    patch = MoEPatch(model, dense_s.config, shipped)
    n = len(args.collect_budgets)
    pruned = build_settings(["base_plus"], E, K, args.collect_budgets)[1:]
    preds = {"shipped": shipped}
    fits = {}
    variants = [("refit_dense", [(dense_s, n)], False),
                ("refit_onpolicy", [(s, 1) for s in pruned], False)]
    calib_windows = []
    if args.with_calib_rows:  # the shipped predictor's own fit rows in front of the decode rows
        from base_sglang.calibration.config import CalibrationConfig
        from base_sglang.calibration.data import read_documents, split_documents, tokenize_documents
        from base_sglang.calibration.pipeline import _batches, split_windows

        cfg = CalibrationConfig()
        doc_ids = tokenize_documents(tok, split_documents(read_documents(args.data), "calib"))
        calib_windows = _batches(split_windows(doc_ids, cfg)[0], cfg.batch_size, "cpu")
        variants = [("calib+dense", [(dense_s, n)], True),
                    ("calib+onpolicy", [(s, 1) for s in pruned], True)]
    for tag, plan, with_calib in variants:
        st = collect(model, patch, patch.blocks, calib, args.prefix, args.steps, plan, E, H,
                     calib_windows if with_calib else ())
        preds[tag], fits[tag] = refit(shipped, st, args.ridge, tag)
        print(f"{tag}: fit pairs per layer {[int(s.n.sum()) for s in st.values()]}", flush=True)
    patch.remove()
    if args.save:
        for tag, _, _ in variants:
            preds[tag].save(f"{args.out}_{tag}.safetensors")

    batches = eval_batches(tok, args.data, args.batch_size, args.num_batches, args.prefix, args.steps,
                           args.split)
    patch = MoEPatch(model, dense_s.config, shipped)
    dense = torch.stack([-run_batch(model, patch, b, args.prefix, args.steps, dense_s).logp_target
                         for b in batches])  # [batches, steps, B]
    patch.remove()
    rows, nlls = [], {}
    for tag, pred in [*preds.items(), ("oracle", shipped)]:
        policy = "oracle_plus" if tag == "oracle" else "base_plus"
        patch = MoEPatch(model, dense_s.config, pred)
        for s in build_settings([policy], E, K, args.budgets)[1:]:
            nll = torch.stack([-run_batch(model, patch, b, args.prefix, args.steps, s).logp_target
                               for b in batches])  # [batches, steps, B]
            nlls[(tag, s.value)] = nll
            dnll, dnll_se = mean_se(nll - dense)
            rows.append({"predictor": tag, "policy": policy, "M": s.value,
                         "ppl_increase_pct": round(float(torch.exp(nll.mean() - dense.mean()) - 1) * 100, 4),
                         "dnll": dnll, "dnll_se": dnll_se})
            print(f"{tag:15s} {s.name:18s} {rows[-1]['ppl_increase_pct']:9.3f} %", flush=True)
        patch.remove()
    for r in rows:  # paired against base_plus with the shipped predictor at the same M
        r["paired_vs_shipped"], r["paired_vs_shipped_se"] = mean_se(
            nlls[(r["predictor"], r["M"])] - nlls[("shipped", r["M"])])
    meta = {"command": "python -m research.onpolicy_fit " + " ".join(args.argv), "commit": start_commit,
            "model": Path(args.model).name, "split": args.split, "batch_size": args.batch_size,
            "num_batches": len(batches), "collect_batches": len(calib), "prefix": args.prefix,
            "steps": args.steps, "collect_budgets": args.collect_budgets, "ridge": args.ridge,
            "train_fit": fits, "torch": torch.__version__, "seconds": round(time.time() - t0, 1)}
    out = write_json(args.out, meta, rows)
    print(table(str(out)))
    print(f"wrote {out} in {meta['seconds']:.0f} s")
    return 0


def table(path: str) -> str:
    """OUT.json -> markdown: perplexity increase (%) per predictor and M; z = paired difference to
    base_plus with the shipped predictor in standard errors (negative = better)."""
    rows = json.loads(Path(path).read_text())["rows"]
    tags = list(dict.fromkeys(r["predictor"] for r in rows))
    by = {(r["predictor"], r["M"]): r for r in rows}
    out = ["| M | " + " | ".join("oracle_plus" if t == "oracle" else f"base_plus ({t})" for t in tags) + " |",
           "|---:|" + "---:|" * len(tags)]
    for m in dict.fromkeys(r["M"] for r in rows):
        cells = []
        for t in tags:
            r = by[(t, m)]
            se = r["paired_vs_shipped_se"]
            cells.append(f"{r['ppl_increase_pct']:.2f}" + (f" (z {r['paired_vs_shipped'] / se:+.1f})" if se else ""))
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from base_sglang.calibration.data import SPLITS

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["table"]:
        print(table(argv[1]))
        return 0
    ap = argparse.ArgumentParser(prog="onpolicy_fit", description=__doc__.split("\n\n")[0])
    add_eval_args(ap)
    ap.add_argument("--split", default="tune", choices=SPLITS, help="the split scored (the fit uses calib)")
    ap.add_argument("--collect-budgets", type=int, nargs="+", default=[8, 12, 16])
    ap.add_argument("--collect-batches", type=int, default=7, help="calibration-split batches of B rows")
    ap.add_argument("--ridge", type=float, default=1e-3)
    ap.add_argument("--with-calib-rows", action="store_true",
                    help="variants calib+dense / calib+onpolicy: base-calibrate's fit rows (dense forwards "
                         "of its fit windows) plus the decode rows")
    ap.add_argument("--save", action="store_true", help="also write OUT_<refit>.safetensors")
    args = ap.parse_args(argv)
    args.argv = argv
    if args.split == "calib":
        ap.error("--split: calib is the fit's split; score tune or report")
    finish_args(ap, args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

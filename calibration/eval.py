"""base-eval: quality versus expert budget under batched teacher-forced decoding.

    base-eval --model PATH --predictor FILE --data FILE --batch-size 16 --prefix 64 --steps 64 \
        --policies base,oracle,gate_sum,frequency,exfold,oea,sere,lynx --out benchmarks/results/NAME

Scores the reporting part of the evaluation half (data.py): base-calibrate never sees it and no policy
knob was chosen on it (knobs are tuned with --split tune). Writes
NAME.json, NAME.csv and NAME.png.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from base_sglang.calibration.config import run_cli
from base_sglang.calibration.data import (
    DEFAULT_EVAL_PERCENT,
    DEFAULT_TUNE_PERCENT,
    SPLITS,
    distinct_batches,
    read_documents,
    split_documents,
    tokenize_documents,
    windows,
)
from base_sglang.calibration.sweep import (
    ALL_POLICIES,
    DEFAULT_POLICIES,
    NEEDS_PREDICTOR,
    parse_fold_variant,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="base-eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--predictor", default=None, help="predictor file from base-calibrate")
    p.add_argument("--data", required=True, help="held-out text: .txt or .jsonl")
    p.add_argument("--out", required=True, help="output path stem (writes .json, .csv, .png)")
    p.add_argument("--split", default="report", choices=SPLITS,
                   help="documents to score: report (default, never used to choose a knob), tune, "
                        "eval (= tune + report), calib, all")
    p.add_argument("--eval-percent", type=int, default=DEFAULT_EVAL_PERCENT)
    p.add_argument("--tune-percent", type=int, default=DEFAULT_TUNE_PERCENT)
    p.add_argument("--batch-size", type=int, default=16, help="decode batch B (rows from different documents)")
    p.add_argument("--num-batches", type=int, default=4, help="batches of B windows to score")
    p.add_argument("--prefix", type=int, default=64, help="tokens prefilled densely")
    p.add_argument("--steps", type=int, default=64, help="decode steps under the policy")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                   help=f"comma-separated subset of {','.join(ALL_POLICIES)} (default: all but the "
                        f"issue-13 variants base_net, base_sched, their oracle_*, and base_fold)")
    p.add_argument("--budgets", type=int, nargs="*", default=None,
                   help="M / D values (default: k, 1.5k, 2k, 3k, 4k, 5k, 6k and half the dense union)")
    p.add_argument("--renorm", default="native", choices=("native", "always", "never", "partial"),
                   help="combine weights after selection for the backfill policies (ablation; native = "
                        "each policy's own rule: partial for base_plus/oracle_plus)")
    p.add_argument("--renorm-alpha", type=float, default=0.5,
                   help="exponent of partial renormalisation (base_plus, oracle_plus, --renorm partial)")
    p.add_argument("--net-lambda", type=float, default=1.0,
                   help="base_net / oracle_net: share of the backfill expert's contribution taken off "
                        "each removal cost (0..1)")
    p.add_argument("--net-iters", type=int, default=2,
                   help="base_net / oracle_net: re-selections on the net loss (>= 1)")
    p.add_argument("--fold-variants", nargs="*", default=None, metavar="RENORM:MAX_LOSS:FALLBACK",
                   help="base_fold settings to run (default native:1:drop); renorm native|never|partial|"
                        "always, fold_max_loss in (0, 1], fallback drop|backfill (core/fold.py)")
    p.add_argument("--no-backfill", action="store_true",
                   help="drop removed slots instead of backfilling them (ablation)")
    p.add_argument("--lynx-tau", type=float, nargs="*", default=None,
                   help="Lynx keep thresholds tau to sweep (default 1, 1/4, 1/B, 1/B^2)")
    p.add_argument("--max-errors", type=float, nargs="*", default=None,
                   help="also run base_plus with error-targeted budgets: each row's predicted relative "
                        "error per MoE layer bounded by each of these values (core/error_budget.py)")
    p.add_argument("--no-energy", action="store_true", help="skip the retained-energy probe (faster)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16, float16")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1, see base-calibrate --help; 0 = torch default)")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli("base-eval", run, args)


def _validate(args) -> list[str]:
    for name in ("batch_size", "num_batches", "prefix", "steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p not in ALL_POLICIES:
            raise ValueError(f"policies: unknown policy {p!r}; choose from {ALL_POLICIES}")
        if p in NEEDS_PREDICTOR and not args.predictor:
            raise ValueError(f"predictor: policy {p!r} needs --predictor (a base-calibrate file)")
    args.fold = tuple(parse_fold_variant(v) for v in (args.fold_variants or ["native:1:drop"]))
    if args.max_errors and not args.predictor:
        raise ValueError("predictor: --max-errors needs --predictor (a base-calibrate file)")
    return policies


def run(args) -> int:
    import torch
    from tqdm.auto import tqdm

    from base_sglang.calibration.decode_eval import EnergyProbe, run_batch
    from base_sglang.calibration.report import environment, table, write_outputs, write_tokens
    from base_sglang.calibration.sweep import (
        build_settings,
        check_targets,
        default_budgets,
        summarize,
        token_increase,
    )
    from base_sglang.core import Predictor
    from base_sglang.core.predictor import describe_model_config
    from base_sglang.hf import MoEPatch, load_model

    policies = _validate(args)
    t0 = time.time()
    model, tokenizer = load_model(args.model, args.device, args.dtype or "auto")
    predictor = Predictor.load(args.predictor) if args.predictor else None
    if predictor is not None:
        predictor.validate(model.config)  # the one architecture check (family match)
        predictor = predictor.to(next(model.parameters()).device)
    desc = describe_model_config(model.config)
    E, K = int(desc["num_experts"]), int(desc["top_k"])
    docs = split_documents(read_documents(args.data), args.split, args.eval_percent,
                           args.tune_percent)
    length = args.prefix + args.steps + 1
    wins = windows(tokenize_documents(tokenizer, docs), length)
    batches = distinct_batches(wins, args.batch_size, args.num_batches)
    if not batches:
        raise ValueError(f"data: fewer than {args.batch_size} documents of the {args.split!r} split have "
                         f"{length} tokens (prefix + steps + 1); lower --batch-size/--prefix/--steps")
    dev = next(model.parameters()).device
    batches = [torch.tensor([w for _, w in b], dtype=torch.long, device=dev) for b in batches]

    patch = MoEPatch(model, build_settings([], E, K, [])[0].config, predictor)
    probe = None if args.no_energy else EnergyProbe(patch)
    dense_setting = build_settings([], E, K, [])[0]
    dense, rows = [], []
    td = time.time()
    for b in batches:
        dense.append(run_batch(model, patch, b, args.prefix, args.steps, dense_setting, probe,
                               keep_logp=True))
    rows.append(summarize(dense_setting, dense, dense, time.time() - td))
    tokens = {}  # setting name -> [N] per-token increase (paired comparisons)
    union = rows[0]["union"]
    budgets = sorted(set(args.budgets)) if args.budgets else default_budgets(E, K, union)
    if any(not 1 <= m for m in budgets):
        raise ValueError(f"budgets: must be >= 1, got {budgets}")
    half_m = max(1, round(union / 2))
    taus = args.lynx_tau or [1.0, 0.25, 1 / args.batch_size, 1 / args.batch_size ** 2]
    settings = build_settings(policies, E, K, budgets, renorm=args.renorm, renorm_alpha=args.renorm_alpha,
                              backfill=not args.no_backfill, lynx_taus=taus,
                              max_errors=tuple(args.max_errors or ()), net_lambda=args.net_lambda,
                              net_iters=args.net_iters, fold_variants=args.fold)[1:]
    for s in tqdm(settings, desc="settings", disable=args.quiet):
        ts = time.time()
        traces = [run_batch(model, patch, b, args.prefix, args.steps, s, probe, ref_logp=d.logp)
                  for b, d in zip(batches, dense)]
        rows.append(summarize(s, traces, dense, time.time() - ts))
        tokens[s.name] = token_increase(traces, dense)
    patch.remove()
    if probe is not None:
        probe.remove()

    checks = check_targets(rows, half_m, predictor.meta.fit_stats if predictor else None, top_k=K,
                           tokens=tokens)
    meta = {
        "model": Path(args.model).resolve().name, "predictor": Path(args.predictor).name if args.predictor else None,
        "data": Path(args.data).name, "command": "base-eval " + " ".join(args.argv),
        "settings": {"batch_size": args.batch_size, "num_batches": len(batches), "prefix": args.prefix,
                     "steps": args.steps, "split": args.split, "eval_percent": args.eval_percent,
                     "tune_percent": args.tune_percent,
                     "policies": policies, "budgets": budgets, "renorm": args.renorm,
                     "renorm_alpha": args.renorm_alpha, "net_lambda": args.net_lambda,
                     "net_iters": args.net_iters,
                     "fold_variants": [list(v) for v in args.fold],
                     "backfill": not args.no_backfill, "lynx_taus": taus,
                     "max_errors": args.max_errors or [], "device": str(dev),
                     "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
                     "energy_probe": probe is not None, "documents": len(docs)},
        "num_experts": E, "top_k": K, "dense_union": union, "seconds": round(time.time() - t0, 1),
        **environment(),
    }
    print(table(rows))
    paths = write_outputs(args.out, rows, meta, checks) + [write_tokens(args.out, tokens)]
    print(_checks_text(checks))
    print("wrote " + ", ".join(str(p) for p in paths) + f" in {time.time() - t0:.0f} s")
    return 0


def _checks_text(c: dict) -> str:
    p = c.get("policy")
    lines = [f"{p} unbeaten by every other policy at equal or lower cost: {c.get('unbeaten')}"
             + (f" (beaten by {', '.join(c['beaten_by'])})" if c.get("beaten_by") else ""),
             f"{p} within 10% of the oracle's increase at every M >= k: "
             f"{c.get('all_within_10pct_of_oracle')}",
             f"{p} within 10% of oracle_plus's increase at every M >= k: "
             f"{c.get('all_within_10pct_of_oracle_plus')}"]
    if "half_union_M" in c:
        lines.append(f"half dense union M={c['half_union_M']}: dppl {c['half_union_dppl_pct']:.2f}% "
                     f"(<= 2%: {c['half_union_within_2pct']})")
    if "predictor_spearman_min" in c:
        lines.append(f"predictor Spearman (min over layers): {c['predictor_spearman_min']:.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

"""base-calibrate: fit BASE's predictor and the baselines' statistics for a Hugging Face MoE checkpoint.

    base-calibrate --model PATH --data FILE(.txt|.jsonl) --out predictor.safetensors \
        [--num-seqs 400 --seq-len 128 --ridge 1e-3 --device cpu|cuda]

Uses only the calibration half of the documents (data.py: content-addressed split), so `base-eval`
on the same file scores documents the predictor never saw.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import fields
from pathlib import Path

from base_sglang.calibration.config import CalibrationConfig, run_cli
from base_sglang.calibration.data import (
    DEFAULT_EVAL_PERCENT,
    SPLITS,
    read_documents,
    split_documents,
    tokenize_documents,
)


def build_parser() -> argparse.ArgumentParser:
    d = {f.name: f.default for f in fields(CalibrationConfig) if not callable(f.default_factory)}
    p = argparse.ArgumentParser(prog="base-calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--data", required=True, help="calibration text: .txt or .jsonl (field 'text')")
    p.add_argument("--out", required=True, help="predictor file to write (.safetensors)")
    p.add_argument("--split", default="calib", choices=SPLITS,
                   help="which documents to use (default: the calibration half)")
    p.add_argument("--eval-percent", type=int, default=DEFAULT_EVAL_PERCENT,
                   help="share of documents reserved for evaluation")
    p.add_argument("--num-seqs", type=int, default=d["num_seqs"])
    p.add_argument("--seq-len", type=int, default=d["seq_len"])
    p.add_argument("--batch-size", type=int, default=d["batch_size"])
    p.add_argument("--ridge", type=float, default=d["ridge"])
    p.add_argument("--heldout-every", type=int, default=d["heldout_every"])
    p.add_argument("--stat-batch", type=int, default=d["stat_batch"])
    p.add_argument("--stat-budgets", type=int, nargs="*", default=[])
    p.add_argument("--sere-tokens", type=int, default=d["sere_tokens"])
    p.add_argument("--sere-metric", default=d["sere_metric"])
    p.add_argument("--max-stats-gib", type=float, default=d["max_stats_gib"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16, float16")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: fastest for the many small per-expert matmuls on "
                        "a busy machine; 0 = torch default)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_cli("base-calibrate", run, build_parser().parse_args(argv))


def run(args) -> int:
    from base_sglang.calibration.pipeline import calibrate, summarize
    from base_sglang.hf import load_model

    if not args.out.endswith(".safetensors"):
        raise ValueError(f"out: {args.out!r} must end in .safetensors")
    cfg = CalibrationConfig(
        num_seqs=args.num_seqs, seq_len=args.seq_len, batch_size=args.batch_size, ridge=args.ridge,
        heldout_every=args.heldout_every, stat_batch=args.stat_batch,
        stat_budgets=tuple(args.stat_budgets), sere_tokens=args.sere_tokens,
        sere_metric=args.sere_metric, max_stats_gib=args.max_stats_gib)
    t0 = time.time()
    docs = split_documents(read_documents(args.data), args.split, args.eval_percent)
    if not docs:
        raise ValueError(f"data: the {args.split!r} split of {args.data} is empty")
    model, tokenizer = load_model(args.model, args.device, args.dtype or "auto")
    doc_ids = tokenize_documents(tokenizer, docs)
    desc = {"data": Path(args.data).name, "split": args.split, "eval_percent": args.eval_percent,
            "documents": len(docs)}
    pred = calibrate(model, doc_ids, cfg, model_id=Path(args.model).resolve().name, data_desc=desc,
                     progress=not args.quiet)
    pred.meta.calibration["seconds_total"] = round(time.time() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pred.save(args.out)
    print(summarize(pred))
    print(f"wrote {args.out}: {len(pred.meta.moe_layers)} MoE layers, {pred.meta.num_experts} experts, "
          f"{pred.meta.calibration['fit_tokens']} fit tokens, {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the research perplexity scripts (sketch_ppl.py, rel_score.py) share: base-eval's batches
and the commit a run starts at. RESEARCH CODE, not a serving path."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch


def eval_batches(tokenizer, data: str, batch_size: int, num_batches: int, prefix: int,
                 steps: int, split: str = "report") -> list[torch.Tensor]:
    """base-eval's batches: [B, prefix + steps + 1] windows from different documents of `split`."""
    from base_sglang.calibration.data import (
        distinct_batches,
        read_documents,
        split_documents,
        tokenize_documents,
        windows,
    )

    docs = split_documents(read_documents(data), split)
    wins = windows(tokenize_documents(tokenizer, docs), prefix + steps + 1)
    batches = distinct_batches(wins, batch_size, num_batches)
    if not batches:
        raise ValueError(f"data: fewer than {batch_size} documents of {split!r} have "
                         f"{prefix + steps + 1} tokens")
    return [torch.tensor([w for _, w in b], dtype=torch.long) for b in batches]


def load_setup(args):
    """(model, tokenizer, predictor, E, K, H) for --model / --predictor, the predictor checked against
    the model (CPU, the checkpoint's dtype)."""
    from base_sglang.core import Predictor
    from base_sglang.core.predictor import describe_model_config
    from base_sglang.hf import load_model

    model, tok = load_model(args.model, "cpu", "auto")
    pred = Predictor.load(args.predictor)
    pred.validate(model.config)
    d = describe_model_config(model.config)
    return model, tok, pred, int(d["num_experts"]), int(d["top_k"]), int(d["hidden_size"])


def mean_se(d: torch.Tensor, digits: int = 5) -> tuple[float, float]:
    """(mean, standard error of the mean) of per-token values d [N], rounded."""
    d = d.flatten()
    return round(float(d.mean()), digits), round(float(d.std() / d.numel() ** 0.5), digits)


def write_json(stem: str, meta: dict, rows: list[dict]) -> Path:
    """Write {"meta", "rows"} to STEM.json (folders made) and return the path."""
    out = Path(stem + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return out


def finish_args(ap, args) -> None:
    """The checks every script makes after parsing: --model is a folder; torch uses --threads."""
    if not Path(args.model).is_dir():
        ap.error(f"--model: no model folder at {args.model}")
    torch.set_num_threads(args.threads)


def commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[1]), "rev-parse",
                               "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except OSError:
        return ""


def add_eval_args(ap) -> None:
    """The flags both scripts take: model, predictor, data, output stem, and base-eval's batching."""
    ap.add_argument("--model", required=True)
    ap.add_argument("--predictor", required=True)
    ap.add_argument("--data", default="base_sglang/data/heldout.txt")
    ap.add_argument("--out", required=True, help="output path stem (writes .json)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 12, 16, 24, 32])
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--num-batches", type=int, default=4)
    ap.add_argument("--prefix", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)

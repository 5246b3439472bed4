"""Issue 13: does the rank-R expert sketch predictor's energy gain show up in perplexity?

    python -m research.sketch_ppl --model base_sglang/models/proxy-moe \
        --predictor base_sglang/models/proxy-moe/predictor.safetensors \
        --data base_sglang/data/heldout.txt --out benchmarks/results/q9/sketch_ppl_proxy_b16 \
        --rank 16 --budgets 8 12 16 24 32 --threads 2

RESEARCH CODE, not a serving path. predictor_study's option sketchR (ridge per (layer, expert) of
y = log(||E_u(z)|| + 1e-6) on [z, log Q~(z), 1], Q~ from the truncated rank-R SVD of the expert's
[W_g; W_u], calibration/expert_sketch.py) is fitted exactly as predictor_study fits it (calibration
split, its fit windows; held-out R^2 on its held-out windows as a sanity check). Then base-eval's
batched teacher-forced decoding (split `report`, same batches, prefix, steps, --no-energy) scores
  base_plus    the shipped linear predictor (predictor file),
  oracle_plus  base_plus's combine rule with the TRUE routed norms,
  sketchR      oracle_plus with the routed norms replaced by exp(yhat) of the sketch predictor:
               base_sglang.hf.patch.expert_output_norms (what MoEPatch's oracle path calls) is swapped
               inside a context manager for a function that finds the layer from the gate_up tensor's
               identity and returns the sketch prediction; restored on exit.
Writes OUT.json: per (policy, M) the mean experts executed, perplexity, increase over dense, its
ratio to oracle_plus's and the share of the base_plus -> oracle_plus gap each row closes.

Shape legend: T tokens, K routed slots, E experts, H hidden size, I expert intermediate, r rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch

from base_sglang.calibration import predictor_study as ps
from base_sglang.calibration.collect import LOG_EPS
from base_sglang.calibration.config import CalibrationConfig
from base_sglang.calibration.expert_sketch import sketch_factors, sketch_features
from research.ppl_common import add_eval_args, commit, eval_batches, finish_args  # noqa: F401 (eval_batches: tests import it here)


@dataclasses.dataclass
class SketchLayer:
    """One layer's fitted sketch predictor: theta [E, H+2] over [z, log Q~, 1], A [E, 2I, r],
    B [E, r, H] (the rank-r SVD factors of every expert's [W_g; W_u])."""

    theta: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor


def predict_log_norms(fit: SketchLayer, z: torch.Tensor, ids: torch.Tensor, down: torch.Tensor,
                      act: Callable) -> torch.Tensor:
    """yhat [T, K] of log(||E_u(z)|| + eps) for every routed slot. z [T, H], ids [T, K]."""
    z = z.float()
    q, _ = sketch_features(z, ids.long(), fit.A, fit.B, down, act)  # [T, K] log Q~
    th = fit.theta[ids.long()]  # [T, K, H+2]
    H = z.shape[1]
    return torch.einsum("th,tkh->tk", z, th[..., :H]) + q * th[..., H] + th[..., H + 1]


def fit_layer(fit_rows, held_rows, experts, rank: int, cfg: CalibrationConfig, B: int,
              budgets) -> tuple[SketchLayer, dict]:
    """predictor_study's sketchR option for one layer: (fitted SketchLayer, its held-out metrics).
    fit_rows / held_rows = (z, logits, w, ids, norms) of predictor_study.collect()."""
    z, lg, w, ids, norms = fit_rows
    K = ids.shape[1]
    E = experts.gate_up_proj.shape[0]
    gu, dn, act = experts.gate_up_proj.detach(), experts.down_proj.detach(), experts.act_fn
    option = f"sketch{rank}"
    tok_idx = torch.arange(z.shape[0]).repeat_interleave(K)  # [T*K]
    e, y = ids.reshape(-1), torch.log(norms + LOG_EPS).reshape(-1)  # [T*K] each
    fa, fb = sketch_factors(gu, rank, "svd", z, ids)  # [E, 2I, r], [E, r, H]
    fq, _ = sketch_features(z, ids, fa, fb, dn, act)  # [T, K]
    theta = ps.ridge(ps.features(option, z, lg, None), y, e, tok_idx, E, cfg.ridge,
                     fq.reshape(-1, 1))  # [E, H+2]
    hz, hlg, hw, hids, hn = held_rows
    hq, _ = sketch_features(hz, hids, fa, fb, dn, act)
    metrics = ps.layer_metrics(theta, ps.features(option, hz, hlg, None), hw, hids, hn, cfg.seq_len,
                               B, budgets, hq[..., None])
    return SketchLayer(theta, fa, fb), metrics


def fit_sketch(model, blocks, tokenizer, data: str, rank: int, cfg: CalibrationConfig,
               B: int = 16) -> tuple[dict[int, SketchLayer], dict]:
    """layer -> SketchLayer fitted on the calibration split's fit windows, and per-layer held-out
    metrics (r2, spearman_cost, energy_pred@M / energy_oracle@M) as predictor_study reports them."""
    from base_sglang.calibration.data import read_documents, split_documents, tokenize_documents
    from base_sglang.calibration.pipeline import split_windows

    docs = tokenize_documents(tokenizer, split_documents(read_documents(data), "calib"))
    fit_w, held_w = split_windows(docs, cfg)
    fit, held = ps.collect(model, blocks, fit_w), ps.collect(model, blocks, held_w)
    E = blocks[min(blocks)].experts.gate_up_proj.shape[0]
    K = fit[min(blocks)][3].shape[1]
    budgets = cfg.budgets_for(E, K)
    fits, metrics = {}, {}
    for j in sorted(blocks):
        fits[j], metrics[str(j)] = fit_layer(fit[j], held[j], blocks[j].experts, rank, cfg, B, budgets)
    metrics["_windows"] = {"fit": len(fit_w), "heldout": len(held_w)}
    return fits, metrics


def sketch_norm_fn(fits: dict[int, SketchLayer], blocks) -> Callable:
    """norm_fn(layer, x, ids, gate_up, down, act) -> exp(yhat) [T, K]: the sketch predictor's norms."""

    def fn(j, x, ids, gate_up, down, act):
        return torch.exp(predict_log_norms(fits[j], x, ids, down.detach(), act))

    return fn


@contextmanager
def replace_norms(blocks, norm_fn: Callable):
    """Within the block, MoEPatch's true-norm policies get routed norms from
    norm_fn(layer, x, ids, gate_up, down, act) [T, K] instead of expert_output_norms. The layer is
    found from the gate_up tensor's identity (a tensor of no MoE block raises KeyError)."""
    from base_sglang.hf import patch as hp

    layer_of = {id(b.experts.gate_up_proj): j for j, b in blocks.items()}
    original = hp.expert_output_norms

    def replacement(hidden, ids, gate_up, down, act=torch.nn.functional.silu):
        return norm_fn(layer_of[id(gate_up)], hidden, ids, gate_up, down, act).float()

    hp.expert_output_norms = replacement
    try:
        yield
    finally:
        hp.expert_output_norms = original




def evaluate(model, predictor, batches, prefix: int, steps: int, budgets, blocks,
             variants: dict[str, Callable], quiet: bool = False) -> list[dict]:
    """sweep.summarize rows: dense, base_plus and oracle_plus at every M, then for each
    (label -> norm_fn) of variants oracle_plus's settings under replace_norms(norm_fn), labelled."""
    from base_sglang.calibration.decode_eval import run_batch
    from base_sglang.calibration.sweep import build_settings, summarize
    from base_sglang.core.predictor import describe_model_config
    from base_sglang.hf import MoEPatch

    desc = describe_model_config(model.config)
    E, K = int(desc["num_experts"]), int(desc["top_k"])
    settings = build_settings(["base_plus", "oracle_plus"], E, K, list(budgets))
    dense_s = settings[0]
    patch = MoEPatch(model, dense_s.config, predictor)
    rows = []
    try:
        t = time.time()
        dense = [run_batch(model, patch, b, prefix, steps, dense_s, keep_logp=True) for b in batches]
        rows.append(summarize(dense_s, dense, dense, time.time() - t))
        oracle = [s for s in settings if s.policy == "oracle_plus"]
        runs = [(s, None) for s in settings[1:]] + [
            (dataclasses.replace(s, name=s.name.replace("oracle_plus", label), policy=label), fn)
            for label, fn in variants.items() for s in oracle]
        for s, fn in runs:
            t = time.time()
            with replace_norms(blocks, fn) if fn is not None else _nothing():
                traces = [run_batch(model, patch, b, prefix, steps, s, ref_logp=d.logp)
                          for b, d in zip(batches, dense)]
            rows.append(summarize(s, traces, dense, time.time() - t))
            if not quiet:
                r = rows[-1]
                print(f"{r['setting']:18s} experts {r['experts']:6.2f}  ppl {r['ppl']:.4f}  "
                      f"+{r['dppl_pct']:.2f} %  ({r['seconds']:.0f} s)", flush=True)
    finally:
        patch.remove()
    return rows


@contextmanager
def _nothing():
    yield


def table_rows(rows: list[dict]) -> list[dict]:
    """Per (policy, M): experts, ppl, increase over dense (%), its ratio to oracle_plus's at the
    same M, and the share of the base_plus -> oracle_plus gap in that increase it closes."""
    by = {(r["policy"], r["value"]): r for r in rows}
    out = []
    for r in rows:
        if r["policy"] == "dense":
            out.append({"policy": "dense", "M": None, "experts": r["experts"], "ppl": r["ppl"],
                        "dppl_pct": 0.0, "dnll_se": 0.0, "ratio_to_oracle_plus": None,
                        "gap_closed": None})
            continue
        m = r["value"]
        o, b = by.get(("oracle_plus", m)), by.get(("base_plus", m))
        ratio = r["dppl_pct"] / o["dppl_pct"] if o and o["dppl_pct"] else None
        gap = (b["dppl_pct"] - r["dppl_pct"]) / (b["dppl_pct"] - o["dppl_pct"]) if (
            o and b and b["dppl_pct"] != o["dppl_pct"]) else None
        out.append({"policy": r["policy"], "M": m, "experts": r["experts"], "ppl": r["ppl"],
                    "dppl_pct": r["dppl_pct"], "dnll_se": r["dnll_se"],
                    "ratio_to_oracle_plus": ratio, "gap_closed": gap})
    return out


def format_table(trows: list[dict]) -> str:
    lines = ["| policy | M | experts | ppl | Δppl % | / oracle_plus | gap closed |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for t in sorted(trows, key=lambda t: (t["M"] or 0, t["policy"])):
        ratio = "" if t["ratio_to_oracle_plus"] is None else f"{t['ratio_to_oracle_plus']:.3f}"
        gap = "" if t["gap_closed"] is None else f"{t['gap_closed']:.2f}"
        lines.append(f"| {t['policy']} | {t['M'] if t['M'] is not None else '-'} | "
                     f"{t['experts']:.2f} | {t['ppl']:.4f} | {t['dppl_pct']:.2f} | {ratio} | {gap} |")
    return "\n".join(lines)




def run(args) -> int:
    from base_sglang.core import Predictor
    from base_sglang.hf import find_moe_blocks, load_model

    t0, head = time.time(), commit()  # the commit the run starts at
    model, tok = load_model(args.model, "cpu", "float32")
    blocks = find_moe_blocks(model, require=True)
    predictor = Predictor.load(args.predictor)
    predictor.validate(model.config)
    cfg = CalibrationConfig(**({"num_seqs": args.num_seqs} if args.num_seqs else {}))
    fits, metrics = fit_sketch(model, blocks, tok, args.data, args.rank, cfg, args.batch_size)
    layers = [k for k in metrics if not k.startswith("_")]
    r2 = sum(metrics[k]["r2"] for k in layers) / len(layers)
    print(f"sketch{args.rank} fit: held-out R^2 mean {r2:.4f} over {len(layers)} layers "
          f"({time.time() - t0:.0f} s)", flush=True)
    batches = eval_batches(tok, args.data, args.batch_size, args.num_batches, args.prefix, args.steps)
    label = f"sketch{args.rank}"
    rows = evaluate(model, predictor, batches, args.prefix, args.steps, sorted(set(args.budgets)),
                    blocks, {label: sketch_norm_fn(fits, blocks)})
    trows = table_rows(rows)
    res = {"meta": {"command": "python -m research.sketch_ppl " + " ".join(args.argv),
                    "commit": head, "model": Path(args.model).resolve().name,
                    "settings": {"split": "report", "batch_size": args.batch_size,
                                 "num_batches": len(batches), "prefix": args.prefix,
                                 "steps": args.steps, "budgets": sorted(set(args.budgets)),
                                 "energy_probe": False, "rank": args.rank, "sketch": "svd",
                                 "threads": args.threads,
                                 "fit_windows": metrics["_windows"]["fit"],
                                 "heldout_windows": metrics["_windows"]["heldout"]},
                    "sketch_r2_mean": r2,
                    "sketch_fit": {k: metrics[k] for k in layers},
                    "seconds": round(time.time() - t0, 1)},
           "rows": trows, "raw_rows": rows}
    out = Path(args.out).with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(format_table(trows))
    print(f"wrote {out} in {time.time() - t0:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sketch_ppl", description=__doc__.split("\n\n")[0])
    add_eval_args(ap)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--num-seqs", type=int, default=None,
                    help="calibration windows (default: CalibrationConfig's, as predictor_study)")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    finish_args(ap, args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

"""Relative removal error: weight BASE's batch score by 1 / ||x_mid_t||^(2 gamma) per token.

    python -m research.rel_score --model base_sglang/models/proxy-moe \
        --predictor base_sglang/models/proxy-moe/predictor.safetensors \
        --data base_sglang/data/heldout.txt --out benchmarks/results/q10/rel_score_proxy_b16 \
        --batch-size 16 --num-batches 4 --budgets 8 12 16 24 32 --threads 1

RESEARCH CODE, not a serving path. The MoE output is added to the residual stream x_mid_t (the input
of the decoder layer's post_attention_layernorm = x + attention output) and everything downstream
reads the stream through RMSNorm, so a removal error of size e matters roughly as e / ||x_mid_t||.
BASE keeps the top-M experts of D_u = sum_t w_{t,u}^2 n_{t,u}^2; the rel policies use
D_u = sum_t w_{t,u}^2 n_{t,u}^2 / ||x_mid_t||^(2 gamma) instead. The per-token weight changes only
the batch's kept set, not any token's backfill order or combine weights. base-eval's batched
teacher-forced decoding (split `report`, same batches, prefix, steps, --no-energy) scores
  base_plus        the shipped linear predictor (predictor file), as base-eval runs it,
  oracle_plus      base_plus's combine rule with the TRUE routed norms, as base-eval runs it,
  oracle_rel[_g]   oracle_plus with each true norm divided by ||x_mid_t||^gamma:
                   base_sglang.hf.patch.expert_output_norms (what MoEPatch's oracle path calls) is
                   swapped inside a context manager (restored on exit),
  base_rel[_g]     base_plus with each PREDICTED log-norm yhat minus gamma * log ||x_mid_t||: the
                   predictor instance's predict_log_norm (what core.selection.select_experts calls
                   for base_plus on the CPU path) is shadowed inside a context manager,
  base_relhat[_g]  base_rel with log ||x_mid_t|| replaced by a per-layer ridge prediction from z_t
                   (the MoE input, all that SGLang's MoE block receives), fitted on the calibration
                   split's fit windows (calibration/pipeline.split_windows, CalibrationConfig
                   defaults as predictor_study uses them); held-out R^2 on its held-out windows,
  oracle_relhat[_g] oracle_rel with the same predicted log ||x_mid_t||.
x_mid is captured with a forward pre-hook on each MoE decoder layer's post_attention_layernorm: one
norm per token row of the current forward (during a decode step, one per batch row). Suffix _g:
gamma = g (e.g. base_rel_0.5); no suffix = gamma 1.

Writes OUT.json: per (policy, M) the mean experts executed, perplexity, increase over dense, the
per-token NLL-increase standard error (dnll_se), the ratio to oracle_plus's increase, the share of
the base_plus -> oracle_plus gap closed, and the PAIRED difference in mean NLL to base_plus and to
oracle_plus at the same M with its standard error (same tokens, so paired).

Shape legend: T tokens (rows of one forward), K routed slots, E experts, H hidden size.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

from research.ppl_common import add_eval_args, commit, eval_batches, finish_args  # noqa: F401 (eval_batches: tests import it here)

REL_FAMILIES = ("oracle_rel", "base_rel", "base_relhat", "oracle_relhat")


# ---- the two swaps -----------------------------------------------------------------------------
def decoder_layers(model):
    return model.model.layers if hasattr(model, "model") else model.layers


class XMidCapture:
    """Forward pre-hooks on post_attention_layernorm of the MoE decoder layers: norms[j] [T] =
    ||x_mid_t|| of the latest forward through layer j (fp32). remove() takes the hooks off."""

    def __init__(self, model, layers):
        self.norms: dict[int, torch.Tensor] = {}
        self.handles = []
        dec = decoder_layers(model)
        for j in layers:
            self.handles.append(dec[j].post_attention_layernorm.register_forward_pre_hook(
                self._hook(j)))

    def _hook(self, j):
        def hook(module, args):
            x = args[0]
            self.norms[j] = x.detach().reshape(-1, x.shape[-1]).float().norm(dim=-1)  # [T]
        return hook

    def log_norm(self, j: int, T: int) -> torch.Tensor:
        """log ||x_mid_t|| [T] of layer j's current forward (checks the row count)."""
        n = self.norms[j]
        if n.shape[0] != T:
            raise RuntimeError(f"x_mid capture: layer {j} holds {n.shape[0]} rows, the MoE call {T}")
        return torch.log(n)

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def rel_norms(norms: torch.Tensor, log_x: torch.Tensor, gamma: float) -> torch.Tensor:
    """norms [T, K] / ||x_mid_t||^gamma (log_x [T] = log ||x_mid_t||)."""
    if gamma == 0:
        return norms
    return norms / torch.exp(gamma * log_x)[:, None]


def rel_log_norms(yhat: torch.Tensor, log_x: torch.Tensor, gamma: float) -> torch.Tensor:
    """yhat [T, K] - gamma * log ||x_mid_t|| (log_x [T])."""
    if gamma == 0:
        return yhat
    return yhat - gamma * log_x[:, None]


@contextmanager
def replace_true_norms(blocks, log_x_fn: Callable, gamma: float):
    """Within the block, MoEPatch's true-norm policies get expert_output_norms(...) / ||x_mid||^gamma,
    with log_x_fn(layer, z [T, H]) -> log ||x_mid_t|| [T]. The layer is found from the gate_up
    tensor's identity (a tensor of no MoE block raises KeyError). Restored on exit."""
    from base_sglang.hf import patch as hp

    layer_of = {id(b.experts.gate_up_proj): j for j, b in blocks.items()}
    original = hp.expert_output_norms

    def replacement(hidden, ids, gate_up, down, act=torch.nn.functional.silu):
        j = layer_of[id(gate_up)]
        return rel_norms(original(hidden, ids, gate_up, down, act).float(),
                         log_x_fn(j, hidden), gamma)

    hp.expert_output_norms = replacement
    try:
        yield
    finally:
        hp.expert_output_norms = original


@contextmanager
def replace_predicted_norms(predictor, log_x_fn: Callable, gamma: float):
    """Within the block, predictor.predict_log_norm(layer, z, ids) returns yhat - gamma log ||x_mid||
    (log_x_fn(layer, z) -> [T]): an instance attribute shadowing the class method, deleted on exit."""
    if "predict_log_norm" in vars(predictor):
        raise RuntimeError("predictor.predict_log_norm is already replaced")
    original = predictor.predict_log_norm  # the bound class method

    def replacement(layer_id, hidden, ids):
        return rel_log_norms(original(layer_id, hidden, ids), log_x_fn(layer_id, hidden), gamma)

    predictor.predict_log_norm = replacement
    try:
        yield
    finally:
        del predictor.predict_log_norm


# ---- the ||x_mid|| predictor (from z) ----------------------------------------------------------
def collect_xz(model, layers, wins: list[list[int]], batch: int = 8):
    """layer -> (z [N, H] = post_attention_layernorm output, log ||x_mid|| [N]) over the windows."""
    dec = decoder_layers(model)
    acc = {j: ([], []) for j in layers}
    handles = []

    def make(j):
        def hook(module, args, output):
            x = args[0].reshape(-1, args[0].shape[-1]).float()
            acc[j][0].append(output.detach().reshape(-1, output.shape[-1]).float())
            acc[j][1].append(torch.log(x.norm(dim=-1)))
        return hook

    try:
        for j in layers:
            handles.append(dec[j].post_attention_layernorm.register_forward_hook(make(j)))
        body = getattr(model, "model", model)
        t = torch.tensor(wins, dtype=torch.long)
        with torch.no_grad():
            for i in range(0, len(t), batch):
                body(input_ids=t[i:i + batch], use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return {j: (torch.cat(acc[j][0]), torch.cat(acc[j][1])) for j in layers}


def fit_ridge(z: torch.Tensor, y: torch.Tensor, ridge: float) -> torch.Tensor:
    """theta [H+1] of y ~ [z, 1] (fp64); lambda = ridge * tr(Z^T Z) / H, the bias unpenalised
    (CalibrationConfig.ridge's rule)."""
    za = torch.cat([z.double(), torch.ones(z.shape[0], 1, dtype=torch.float64)], 1)  # [N, H+1]
    g = za.T @ za
    H = z.shape[1]
    lam = ridge * torch.trace(g[:H, :H]) / H
    reg = torch.diag(torch.cat([torch.full((H,), float(lam), dtype=torch.float64),
                                torch.zeros(1, dtype=torch.float64)]))
    return torch.linalg.solve(g + reg, za.T @ y.double()).float()


def predict_ridge(theta: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return z.float() @ theta[:-1] + theta[-1]  # [T]


def r2(y: torch.Tensor, yhat: torch.Tensor) -> float:
    return float(1 - (y - yhat).square().sum() / (y - y.mean()).square().sum())


def fit_xmid_predictor(model, layers, tokenizer, data: str, cfg) -> tuple[dict, dict]:
    """layer -> theta [H+1] of log ||x_mid|| ~ [z, 1], fitted on the calibration split's fit windows,
    and per-layer held-out R^2 / stats on its held-out windows."""
    from base_sglang.calibration.data import read_documents, split_documents, tokenize_documents
    from base_sglang.calibration.pipeline import split_windows

    docs = tokenize_documents(tokenizer, split_documents(read_documents(data), "calib"))
    fit_w, held_w = split_windows(docs, cfg)
    fit, held = collect_xz(model, layers, fit_w), collect_xz(model, layers, held_w)
    thetas, metrics = {}, {}
    for j in layers:
        thetas[j] = fit_ridge(*fit[j], cfg.ridge)
        hz, hy = held[j]
        fy = fit[j][1]
        xn = torch.exp(hy)
        metrics[str(j)] = {"r2_heldout": r2(hy, predict_ridge(thetas[j], hz)),
                           "r2_fit": r2(fy, predict_ridge(thetas[j], fit[j][0])),
                           "cv_xmid_heldout": float(xn.std() / xn.mean()),
                           "p95_over_p5_heldout": float(torch.quantile(xn, 0.95)
                                                        / torch.quantile(xn, 0.05))}
    metrics["_windows"] = {"fit": len(fit_w), "heldout": len(held_w), "seq_len": cfg.seq_len}
    return thetas, metrics


# ---- evaluation --------------------------------------------------------------------------------
def parse_policy(label: str) -> tuple[str, float]:
    """'base_rel' -> ('base_rel', 1.0); 'oracle_rel_0.5' -> ('oracle_rel', 0.5)."""
    for fam in sorted(REL_FAMILIES, key=len, reverse=True):
        if label == fam:
            return fam, 1.0
        if label.startswith(fam + "_"):
            return fam, float(label[len(fam) + 1:])
    raise ValueError(f"policy: {label!r} is not one of {REL_FAMILIES} (optionally _GAMMA)")




def swap_for(label: str, blocks, predictor, capture: XMidCapture, xhat: dict | None):
    """(base setting policy 'base_plus' / 'oracle_plus', context manager factory) of a rel label."""
    fam, gamma = parse_policy(label)
    if fam.endswith("hat"):
        if xhat is None:
            raise ValueError(f"{label}: needs the fitted ||x_mid|| predictor")

        def log_x(j, z):
            return predict_ridge(xhat[j], z)
    else:
        def log_x(j, z):
            return capture.log_norm(j, z.shape[0])
    if fam.startswith("oracle"):
        return "oracle_plus", lambda: replace_true_norms(blocks, log_x, gamma)
    return "base_plus", lambda: replace_predicted_norms(predictor, log_x, gamma)


def evaluate(model, predictor, batches, prefix: int, steps: int, budgets, blocks,
             labels: list[str], xhat: dict | None = None, quiet: bool = False):
    """sweep.summarize rows (dense, base_plus and oracle_plus at every M, then each rel label at
    every M) and setting name -> per-token log-prob of the target [N] (for paired differences)."""
    from base_sglang.calibration.decode_eval import run_batch
    from base_sglang.calibration.sweep import build_settings, summarize
    from base_sglang.core.predictor import describe_model_config
    from base_sglang.hf import MoEPatch

    desc = describe_model_config(model.config)
    E, K = int(desc["num_experts"]), int(desc["top_k"])
    settings = build_settings(["base_plus", "oracle_plus"], E, K, list(budgets))
    dense_s = settings[0]
    patch = MoEPatch(model, dense_s.config, predictor)
    capture = XMidCapture(model, sorted(blocks))
    rows, lps = [], {}
    try:
        t = time.time()
        dense = [run_batch(model, patch, b, prefix, steps, dense_s, keep_logp=True) for b in batches]
        rows.append(summarize(dense_s, dense, dense, time.time() - t))
        lps["dense"] = torch.cat([d.logp_target.reshape(-1) for d in dense]).double()
        runs = [(s, None) for s in settings[1:]]
        for label in labels:
            base_policy, ctx = swap_for(label, blocks, predictor, capture, xhat)
            runs += [(dataclasses.replace(s, name=s.name.replace(base_policy, label), policy=label),
                      ctx) for s in settings[1:] if s.policy == base_policy]
        for s, ctx in runs:
            t = time.time()
            with ExitStack() as stack:
                if ctx is not None:
                    stack.enter_context(ctx())
                traces = [run_batch(model, patch, b, prefix, steps, s, ref_logp=d.logp)
                          for b, d in zip(batches, dense)]
            rows.append(summarize(s, traces, dense, time.time() - t))
            lps[s.name] = torch.cat([tr.logp_target.reshape(-1) for tr in traces]).double()
            if not quiet:
                r = rows[-1]
                print(f"{r['setting']:22s} experts {r['experts']:6.2f}  ppl {r['ppl']:.4f}  "
                      f"+{r['dppl_pct']:.2f} %  se {r['dnll_se']:.4f}  ({r['seconds']:.0f} s)",
                      flush=True)
    finally:
        capture.remove()
        patch.remove()
    return rows, lps


def paired(lps: dict, a: str, b: str) -> tuple[float, float] | None:
    """(mean NLL of a minus mean NLL of b, its paired standard error) over the same tokens."""
    if a not in lps or b not in lps:
        return None
    diff = lps[b] - lps[a]  # per token: nll_a - nll_b
    return float(diff.mean()), float(diff.std() / math.sqrt(diff.numel()))


def table_rows(rows: list[dict], lps: dict | None = None) -> list[dict]:
    """Per (policy, M): experts, ppl, increase over dense (%), dnll_se, its ratio to oracle_plus's,
    the share of the base_plus -> oracle_plus gap closed, and paired NLL differences to both."""
    by = {(r["policy"], r["value"]): r for r in rows}
    lps = lps or {}
    out = []
    for r in rows:
        if r["policy"] == "dense":
            out.append({"policy": "dense", "M": None, "experts": r["experts"], "ppl": r["ppl"],
                        "dppl_pct": 0.0, "dnll": 0.0, "dnll_se": 0.0})
            continue
        m = r["value"]
        o, b = by.get(("oracle_plus", m)), by.get(("base_plus", m))
        ratio = r["dppl_pct"] / o["dppl_pct"] if o and o["dppl_pct"] else None
        gap = (b["dppl_pct"] - r["dppl_pct"]) / (b["dppl_pct"] - o["dppl_pct"]) if (
            o and b and b["dppl_pct"] != o["dppl_pct"]) else None
        t = {"policy": r["policy"], "M": m, "experts": r["experts"], "ppl": r["ppl"],
             "dppl_pct": r["dppl_pct"], "dnll": r["dnll"], "dnll_se": r["dnll_se"],
             "ratio_to_oracle_plus": ratio, "gap_closed": gap}
        for ref in ("base_plus", "oracle_plus"):
            p = paired(lps, r["setting"], f"{ref} M={m}") if r["policy"] != ref else None
            if p is not None:
                t[f"dnll_vs_{ref}"], t[f"dnll_vs_{ref}_se_paired"] = p
                rr = by[(ref, m)]
                t[f"dnll_vs_{ref}_se_combined"] = math.hypot(r["dnll_se"], rr["dnll_se"])
        out.append(t)
    return out


def format_table(trows: list[dict]) -> str:
    lines = ["| policy | M | experts | ppl | Δppl % | dnll_se | / oracle_plus | gap closed | "
             "ΔNLL vs base_plus (paired SE) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for t in sorted(trows, key=lambda t: (t["M"] or 0, t["policy"])):
        ratio = "" if t.get("ratio_to_oracle_plus") is None else f"{t['ratio_to_oracle_plus']:.3f}"
        gap = "" if t.get("gap_closed") is None else f"{t['gap_closed']:.2f}"
        vb = ("" if "dnll_vs_base_plus" not in t else
              f"{t['dnll_vs_base_plus']:+.4f} ({t['dnll_vs_base_plus_se_paired']:.4f})")
        lines.append(f"| {t['policy']} | {t['M'] if t['M'] is not None else '-'} | "
                     f"{t['experts']:.2f} | {t['ppl']:.4f} | {t['dppl_pct']:.2f} | "
                     f"{t['dnll_se']:.4f} | {ratio} | {gap} | {vb} |")
    return "\n".join(lines)


def grid_table(results: list[dict]) -> str:
    """Rows of one or more result JSONs (same batch size) as a policy x M grid: the increase over
    dense (%) and, for a rel policy, its paired NLL difference (nats) to its unweighted
    counterpart (base_* -> base_plus, oracle_* -> oracle_plus) +- the paired SE."""
    cells: dict[str, dict[int, str]] = {}
    for res in results:
        for t in res["rows"]:
            if t["M"] is None or (t["policy"] in cells and t["M"] in cells[t["policy"]]):
                continue
            ref = "oracle_plus" if t["policy"].startswith("oracle") else "base_plus"
            d = (f"; {t[f'dnll_vs_{ref}']:+.3f} ± {t[f'dnll_vs_{ref}_se_paired']:.3f}"
                 if f"dnll_vs_{ref}" in t and t["policy"] != ref else "")
            cells.setdefault(t["policy"], {})[t["M"]] = f"{t['dppl_pct']:.1f}{d}"
    ms = sorted({m for c in cells.values() for m in c})
    out = ["| policy | " + " | ".join(f"M={m}" for m in ms) + " |", "|---|" + "---:|" * len(ms)]
    for pol in sorted(cells, key=lambda p: (p.startswith("oracle"), p != "base_plus" and p != "oracle_plus", p)):
        out.append(f"| {pol} | " + " | ".join(cells[pol].get(m, "-") for m in ms) + " |")
    return "\n".join(out)


def compare_committed(rows: list[dict], path: str) -> dict:
    """setting -> (ours, committed) ppl / experts / dnll_se for the rows both files have."""
    if not path or not Path(path).exists():
        return {}
    ref = {r["setting"]: r for r in json.loads(Path(path).read_text())["rows"]}
    out = {}
    for r in rows:
        c = ref.get(r["setting"])
        if c is None or r["policy"] not in ("dense", "base_plus", "oracle_plus"):
            continue
        out[r["setting"]] = {k: [r[k], c[k]] for k in ("ppl", "experts", "dnll_se", "dppl_pct")}
        out[r["setting"]]["exact"] = all(r[k] == c[k] for k in ("ppl", "experts", "dnll_se"))
        out[r["setting"]]["ppl_rel_diff"] = abs(r["ppl"] - c["ppl"]) / c["ppl"]
    return out




def run(args) -> int:
    import transformers

    from base_sglang.calibration.config import CalibrationConfig
    from base_sglang.core import Predictor
    from base_sglang.hf import find_moe_blocks, load_model

    t0, head = time.time(), commit()
    model, tok = load_model(args.model, "cpu", "float32")
    blocks = find_moe_blocks(model, require=True)
    predictor = Predictor.load(args.predictor)
    predictor.validate(model.config)
    predictor = predictor.to(next(model.parameters()).device)  # as base-eval
    labels = list(dict.fromkeys(args.policies))
    for lab in labels:
        parse_policy(lab)
    xhat, xmetrics = None, None
    if any(parse_policy(lab)[0].endswith("hat") for lab in labels):
        cfg = CalibrationConfig(**({"num_seqs": args.num_seqs} if args.num_seqs else {}))
        xhat, xmetrics = fit_xmid_predictor(model, sorted(blocks), tok, args.data, cfg)
        layers = [k for k in xmetrics if not k.startswith("_")]
        r2m = sum(xmetrics[k]["r2_heldout"] for k in layers) / len(layers)
        xmetrics["_r2_heldout_mean"] = r2m
        print(f"||x_mid|| ridge on [z, 1]: held-out R^2 mean {r2m:.4f} per layer "
              + " ".join(f"{xmetrics[k]['r2_heldout']:.3f}" for k in layers)
              + f" ({time.time() - t0:.0f} s)", flush=True)
    batches = eval_batches(tok, args.data, args.batch_size, args.num_batches, args.prefix, args.steps)
    budgets = sorted(set(args.budgets))
    rows, lps = evaluate(model, predictor, batches, args.prefix, args.steps, budgets, blocks,
                         labels, xhat, quiet=args.quiet)
    trows = table_rows(rows, lps)
    repro = compare_committed(rows, args.committed)
    res = {"meta": {"command": "python -m research.rel_score " + " ".join(args.argv),
                    "commit": head, "model": Path(args.model).resolve().name,
                    "settings": {"split": "report", "batch_size": args.batch_size,
                                 "num_batches": len(batches), "prefix": args.prefix,
                                 "steps": args.steps, "budgets": budgets, "policies": labels,
                                 "energy_probe": False, "threads": args.threads},
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "xmid_predictor": xmetrics,
                    "committed_rows": args.committed,
                    "reproduction": repro,
                    "reproduced_exactly": bool(repro) and all(v["exact"] for v in repro.values()),
                    "seconds": round(time.time() - t0, 1)},
           "rows": trows, "raw_rows": rows}
    out = Path(args.out).with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(format_table(trows))
    if repro:
        worst = max(v["ppl_rel_diff"] for v in repro.values())
        print(f"committed rows ({args.committed}): {len(repro)} compared, exact: "
              f"{res['meta']['reproduced_exactly']}, worst ppl relative diff {worst:.2e}")
    print(f"wrote {out} in {time.time() - t0:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--report"]:  # --report FILE.json ...: the grid of those results
        if len(argv) < 2 or not all(Path(p).is_file() for p in argv[1:]):
            print("--report: give one or more result JSON files", file=sys.stderr)
            return 2
        print(grid_table([json.loads(Path(p).read_text()) for p in argv[1:]]))
        return 0
    ap = argparse.ArgumentParser(prog="rel_score", description=__doc__.split("\n\n")[0])
    add_eval_args(ap)
    ap.add_argument("--policies", nargs="+",
                    default=["oracle_rel", "base_rel", "oracle_rel_0.5", "base_rel_0.5"],
                    help=f"rel labels: {', '.join(REL_FAMILIES)}, optionally _GAMMA")
    ap.add_argument("--num-seqs", type=int, default=None,
                    help="calibration windows for the ||x_mid|| predictor (default CalibrationConfig's)")
    ap.add_argument("--committed", default=None,
                    help="a base-eval JSON whose dense/base_plus/oracle_plus rows to compare with")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    args.argv = argv
    finish_args(ap, args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

"""Issue 13: does a token's predictor error at the previous MoE layer help predict this layer's?

    python -m research.crosslayer_residual --model DIR [--out FILE.json]
In a decode step the layer below has already executed its kept experts, so their output norms,
and the errors r = y - yhat of the predictor there (y = log(||E_u(z)|| + eps)), are known before
this layer selects. If a token's errors share a token-level part across layers (a "loud" token
whose every expert output is larger than its z predicts), the mean error below corrects this
layer's prediction of all its routed experts: yhat' = yhat + beta_l * rbar_{l-1}(t), beta_l per
layer by least squares on the fit rows. The score D_u = sum_t w^2 exp(2 yhat') weighs tokens, so a
token-level correction can change the kept set even though it leaves each token's ranking alone.

Rows, per layer (same calibration split, windows, ridge and retained-energy metric as
predictor_study's `linear` option, B = 16 tokens of one position):
- `below`: rbar = the mean error of the token's K routed slots at the previous layer (best case:
  every routed slot observed; serving observes the kept ones);
- `below_w`: the same mean weighted by w^2 (the slots that count most in the score);
- `same_loo` (a bound, not servable): the mean error of the token's *other* K-1 slots at this
  layer, beta fitted the same way: how much a token-level part of this layer's error is worth.

Shape legend: T tokens (windows of S, window-major), K routed slots, E experts, H hidden size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from base_sglang.calibration import predictor_study as ps
from base_sglang.calibration.collect import LOG_EPS
from base_sglang.calibration.config import CalibrationConfig
from research.temporal_residual import predict, r2, retained

KINDS = ("below", "below_w", "same_loo")


def token_mean(r: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """[T] the (weighted) mean of r [T, K] over the token's slots."""
    if weight is None:
        return r.mean(-1)
    return (r * weight).sum(-1) / weight.sum(-1).clamp_min(1e-12)


def leave_one_out(r: torch.Tensor) -> torch.Tensor:
    """[T, K] the mean of the token's other K-1 slots' r."""
    K = r.shape[-1]
    return (r.sum(-1, keepdim=True) - r) / (K - 1)


def offsets(kind: str, r_below: torch.Tensor | None, w_below, r_here: torch.Tensor) -> torch.Tensor | None:
    """[T, K] the correction feature of each routed slot (None where the layer has none below)."""
    K = r_here.shape[-1]
    if kind == "same_loo":
        return leave_one_out(r_here)
    if r_below is None:
        return None
    wt = None if kind == "below" else w_below.float().square()
    return token_mean(r_below, wt)[:, None].expand(-1, K)


def fit_beta(x: torch.Tensor, r: torch.Tensor) -> float:
    """Least-squares beta of r ~ beta x (no intercept: the ridge's bias already centres r)."""
    return float((x * r).sum() / x.square().sum().clamp_min(1e-12))


def run(args) -> int:
    from base_sglang.calibration.data import read_documents, split_documents, tokenize_documents
    from base_sglang.calibration.pipeline import split_windows
    from base_sglang.core.predictor import describe_model_config
    from base_sglang.hf import find_moe_blocks, load_model

    t0 = time.time()
    model, tok = load_model(args.model, "cpu", "float32")
    blocks = find_moe_blocks(model, require=True)
    desc = describe_model_config(model.config)
    E, K = int(desc["num_experts"]), int(desc["top_k"])
    cfg = CalibrationConfig()
    docs = tokenize_documents(tok, split_documents(read_documents(args.data), "calib"))
    fit_w, held_w = split_windows(docs, cfg)
    fit, held = ps.collect(model, blocks, fit_w), ps.collect(model, blocks, held_w)
    S, budgets, out = cfg.seq_len, (K, 2 * K, 4 * K), {}
    prev = None  # (fit residual, fit w, held residual, held w) of the layer below
    for j in sorted(blocks):
        z, lg, w, ids, norms = fit[j]
        tok_idx = torch.arange(z.shape[0]).repeat_interleave(K)
        y = torch.log(norms + LOG_EPS)  # [T, K]
        theta = ps.ridge(ps.features("linear", z, lg, None), y.reshape(-1), ids.reshape(-1), tok_idx,
                         E, cfg.ridge)  # [E, H+1]
        resid = y - predict(theta, z, ids)  # [T, K]
        hz, _hlg, hw, hids, hn = held[j]
        hy = torch.log(hn + LOG_EPS)
        yhat = predict(theta, hz, hids)
        hres = hy - yhat
        base = retained(yhat, hw, hids, hn, E, S, args.batch_size, budgets)
        row = {"r2_linear": r2(hy, yhat), **{f"energy_linear@{m}": base[m][0] for m in budgets},
               **{f"energy_oracle@{m}": base[m][1] for m in budgets}}
        for kind in KINDS:
            xf = offsets(kind, prev and prev[0], prev and prev[1], resid)
            xh = offsets(kind, prev and prev[2], prev and prev[3], hres)
            if xf is None:
                continue
            beta = fit_beta(xf, resid)
            corrected = yhat + beta * xh
            got = retained(corrected, hw, hids, hn, E, S, args.batch_size, budgets)
            row[f"{kind}_beta"] = beta
            row[f"{kind}_corr"] = float(torch.corrcoef(torch.stack([xh.reshape(-1), hres.reshape(-1)]))[0, 1])
            row[f"{kind}_r2"] = r2(hy, corrected)
            for m in budgets:
                row[f"{kind}_energy@{m}"] = got[m][0]
        out[str(j)] = row
        print(j, f"R2 {row['r2_linear']:.3f}  " + "  ".join(
            f"{kind}: corr {row[f'{kind}_corr']:.3f} beta {row[f'{kind}_beta']:.2f} R2 {row[f'{kind}_r2']:.3f} "
            + " ".join(f"E@{m} {row[f'{kind}_energy@{m}'] - row[f'energy_linear@{m}']:+.4f}" for m in budgets)
            for kind in KINDS if f"{kind}_corr" in row)
            + "  gap@" + " ".join(f"{m} {row[f'energy_oracle@{m}'] - row[f'energy_linear@{m}']:.4f}"
                                  for m in budgets), flush=True)
        prev = (resid, w, hres, hw)
    res = {"layers": out, "meta": {"model": Path(args.model).resolve().name, "budgets": list(budgets),
                                   "batch_size": args.batch_size, "fit_windows": len(fit_w),
                                   "heldout_windows": len(held_w), "seconds": round(time.time() - t0, 1)}}
    res["summary"] = summary(out, budgets)
    print(json.dumps(res["summary"], indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"{time.time() - t0:.0f} s")
    return 0


def summary(layers: dict, budgets) -> dict:
    """Per kind: mean corr, and the share of the energy gap to the oracle closed (layer means, over
    the layers the kind exists on)."""
    out = {}
    for kind in KINDS:
        rows = [r for r in layers.values() if f"{kind}_corr" in r]
        if not rows:
            continue
        s = {"layers": len(rows), "corr_mean": sum(r[f"{kind}_corr"] for r in rows) / len(rows)}
        for m in budgets:
            gap = sum(r[f"energy_oracle@{m}"] - r[f"energy_linear@{m}"] for r in rows)
            gain = sum(r[f"{kind}_energy@{m}"] - r[f"energy_linear@{m}"] for r in rows)
            s[f"gap_closed@{m}"] = gain / gap if gap > 0 else 0.0
        out[kind] = s
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="crosslayer_residual", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", default="base_sglang/data/heldout.txt")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if not Path(args.model).is_dir():
        ap.error(f"--model: no model folder at {args.model}")
    torch.set_num_threads(1)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

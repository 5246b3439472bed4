"""Issue 13: does the previous token's observed predictor error help predict this token's?

    python -m research.temporal_residual --model DIR [--out FILE.json]
In decode, the experts a request's previous token executed have known output norms, so their
prediction errors r = y - yhat (y = log(||E_u(z)|| + eps)) could correct this token's prediction of
the same expert: yhat' = yhat + beta * r_prev, beta per layer by least squares on the fit rows.
This measures the best case: every routed pair of the previous token counts as observed (in serving
only the kept ones are). Same calibration split, windows, ridge and metrics as predictor_study's
`linear` option (held-out R^2; retained true removal energy of the top-M by predicted cost at B = 16
tokens of one position, next to the oracle's); r_prev exists where token t-1 of the same window
routed expert u too.

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


def prev_residual(ids: torch.Tensor, r: torch.Tensor, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(r_prev [T, K], has [T, K]): the residual of the same expert at token t-1 of the same window
    of `seq` tokens (0 and False where t-1 did not route that expert or t starts a window)."""
    T = ids.shape[0]
    eq = ids[1:, :, None] == ids[:-1, None, :]  # [T-1, K, K] slot k of t routes t-1's slot k'
    starts = (torch.arange(1, T) % seq) == 0  # [T-1] t begins a window: no previous token
    hit = eq.any(-1) & ~starts[:, None]  # [T-1, K]
    val = (eq.to(r.dtype) * r[:-1, None, :]).sum(-1)  # [T-1, K]
    out, has = torch.zeros_like(r), torch.zeros(r.shape, dtype=torch.bool)
    out[1:], has[1:] = torch.where(hit, val, 0.0), hit
    return out, has


def retained(yhat, w, ids, norms, E: int, seq: int, B: int, budgets) -> dict:
    """M -> (energy kept by the top-M of the predicted scores, the oracle's): predictor_study's."""
    c_true = w.float().square() * norms.square()  # [T, K]
    return ps.retained_energy(w.float().square() * torch.exp(2 * yhat), c_true, ids, E, seq, B, budgets)


def predict(theta: torch.Tensor, z: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The linear predictor's yhat [T, K] of each routed slot: theta [E, H+1], z [T, H]."""
    th = theta[ids]  # [T, K, H+1]
    return torch.einsum("th,tkh->tk", z.float(), th[..., :-1]) + th[..., -1]


def r2(y: torch.Tensor, yhat: torch.Tensor) -> float:
    return float(1 - (y - yhat).square().sum() / (y - y.mean()).square().sum())


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
    S, budgets, out = cfg.seq_len, (2 * K, 4 * K), {}
    for j in sorted(blocks):
        z, lg, w, ids, norms = fit[j]
        tok_idx = torch.arange(z.shape[0]).repeat_interleave(K)
        y = torch.log(norms + LOG_EPS)  # [T, K]
        theta = ps.ridge(ps.features("linear", z, lg, None), y.reshape(-1), ids.reshape(-1), tok_idx,
                         E, cfg.ridge)  # [E, H+1]
        resid = y - predict(theta, z, ids)  # [T, K]
        rp, has = prev_residual(ids, resid, S)
        beta = float((rp[has] * resid[has]).sum() / rp[has].square().sum().clamp_min(1e-12))
        hz, _hlg, hw, hids, hn = held[j]
        hy = torch.log(hn + LOG_EPS)
        yhat = predict(theta, hz, hids)
        hrp, hhas = prev_residual(hids, hy - yhat, S)
        corrected = yhat + beta * hrp

        base = retained(yhat, hw, hids, hn, E, S, args.batch_size, budgets)
        corr = retained(corrected, hw, hids, hn, E, S, args.batch_size, budgets)
        out[str(j)] = {
            "has_prev": float(hhas.float().mean()), "beta": beta,
            "corr_prev_residual": float(torch.corrcoef(torch.stack([hrp[hhas], (hy - yhat)[hhas]]))[0, 1]),
            "r2_linear": r2(hy, yhat), "r2_corrected": r2(hy, corrected),
            **{f"energy_linear@{m}": base[m][0] for m in budgets},
            **{f"energy_corrected@{m}": corr[m][0] for m in budgets},
            **{f"energy_oracle@{m}": base[m][1] for m in budgets}}
        o = out[str(j)]
        print(j, f"prev observed {o['has_prev']:.2f}  corr {o['corr_prev_residual']:.3f}  beta {beta:.2f}  "
              f"R2 {o['r2_linear']:.3f} -> {o['r2_corrected']:.3f}  " + "  ".join(
                  f"E@{m} {base[m][0]:.4f} -> {corr[m][0]:.4f} (oracle {base[m][1]:.4f})" for m in budgets),
              flush=True)
    res = {"layers": out, "meta": {"model": Path(args.model).resolve().name, "budgets": list(budgets),
                                   "batch_size": args.batch_size, "fit_windows": len(fit_w),
                                   "heldout_windows": len(held_w), "seconds": round(time.time() - t0, 1)}}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"{time.time() - t0:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="temporal_residual", description=__doc__.split("\n\n")[0])
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

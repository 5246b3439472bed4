"""The predictor on the policy's own trajectory: held-out R^2 of the log-norm, dense vs pruned decode.

    python -m research.onpolicy_r2 --model base_sglang/models/proxy-moe \
        --predictor base_sglang/models/proxy-moe/predictor.safetensors \
        --out benchmarks/results/q15/onpolicy_proxy_b16 --split tune --num-batches 2 --budgets 8 16

RESEARCH CODE, not a serving path. The predictor is fitted on dense forwards of the calibration
split; under a budget every later layer's input z_t comes from a pruned trajectory. If that shift
degraded the predictions, fitting on pruned trajectories ("on-policy" calibration) could close part
of the base_plus -> oracle_plus gap. base-eval's batched decoding (dense prefill, B rows per step)
runs dense and base_plus at each M; a forward hook on every router recomputes, at the decode steps
only (the prefill is dense under every setting), for each routed pair
(t, u) of the model's own top-k, the true y = log(||E_u(z_t)|| + 1e-6) and the prediction yhat, and
OUT.json holds per (setting, layer) R^2 = 1 - sum (y - yhat)^2 / sum (y - mean y)^2 (over all routed
pairs, as base-calibrate's pooled held-out R^2) and the mean residual y - yhat
(`python -m research.onpolicy_r2 table OUT.json` prints it).

Shape legend: T tokens of one forward, K routed slots, H hidden size.
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
    write_json,
)


def run(args) -> int:
    from base_sglang.calibration.collect import LOG_EPS
    from base_sglang.calibration.decode_eval import run_batch
    from base_sglang.calibration.sweep import build_settings
    from base_sglang.hf import MoEPatch
    from base_sglang.hf.blocks import routed_outputs

    t0, start_commit = time.time(), commit()  # the code that runs (HEAD may move during a long run)
    model, tok, pred, E, K, H = load_setup(args)
    batches = eval_batches(tok, args.data, args.batch_size, args.num_batches, args.prefix, args.steps,
                           args.split)
    settings = build_settings(["base_plus"], E, K, args.budgets)  # dense first
    patch = MoEPatch(model, settings[0].config, pred)
    pairs: dict[tuple[str, int], list[torch.Tensor]] = {}  # (setting, layer) -> [(y, yhat) [T*K, 2]]
    state = {"key": None}

    def make(layer_id, block):
        def hook(module, hook_args, output):
            x = hook_args[0].reshape(-1, hook_args[0].shape[-1])  # [T, H]
            if state["key"] is None or x.shape[0] != args.batch_size:  # decode steps only (T = B),
                return None  # not the dense prefill (T = B * prefix)
            _, _, ids = type(module).forward(module, x)  # the model's own top-k (unpatched)
            ids = ids.reshape(x.shape[0], -1).long()  # [T, K]
            y = torch.log(routed_outputs(x, ids, block.experts).norm(dim=-1) + LOG_EPS)  # [T, K]
            yhat = pred.predict_log_norm(layer_id, x, ids)  # [T, K]
            pairs.setdefault((state["key"], layer_id), []).append(torch.stack([y, yhat], -1).reshape(-1, 2))
            return None

        return hook

    handles = [b.gate.register_forward_hook(make(j, b)) for j, b in patch.blocks.items()]
    try:
        for s in settings:
            state["key"] = s.name
            for b in batches:
                run_batch(model, patch, b, args.prefix, args.steps, s)
        state["key"] = None
    finally:
        for h in handles:
            h.remove()
        patch.remove()
    rows = []
    for s in settings:
        for j in sorted(patch.blocks):
            yy = torch.cat(pairs[(s.name, j)])  # [N, 2]
            y, yhat = yy[:, 0].double(), yy[:, 1].double()
            r2 = 1 - float((y - yhat).square().sum() / (y - y.mean()).square().sum())
            rows.append({"setting": s.name, "layer": j, "pairs": int(y.numel()), "r2": round(r2, 4),
                         "mean_residual": round(float((y - yhat).mean()), 4)})
    print("layer " + " ".join(f"{s.name:>24s}" for s in settings))
    for j in sorted(patch.blocks):
        cells = [r for r in rows if r["layer"] == j]
        print(f"{j:5d} " + " ".join(f"R2 {r['r2']:.3f} res {r['mean_residual']:+.3f}".rjust(24) for r in cells))
    meta = {"command": "python -m research.onpolicy_r2 " + " ".join(args.argv), "commit": start_commit,
            "model": Path(args.model).name, "split": args.split, "batch_size": args.batch_size,
            "num_batches": len(batches), "prefix": args.prefix, "steps": args.steps,
            "torch": torch.__version__, "seconds": round(time.time() - t0, 1)}
    out = write_json(args.out, meta, rows)
    print(f"wrote {out} in {meta['seconds']:.0f} s")
    return 0


def table(path: str) -> str:
    """OUT.json -> markdown: per layer R^2 (mean residual) under each setting."""
    rows = json.loads(Path(path).read_text())["rows"]
    names = list(dict.fromkeys(r["setting"] for r in rows))
    out = ["| layer | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    for j in sorted({r["layer"] for r in rows}):
        cell = {r["setting"]: r for r in rows if r["layer"] == j}
        out.append(f"| {j} | " + " | ".join(f"{cell[n]['r2']:.3f} ({cell[n]['mean_residual']:+.3f})"
                                           for n in names) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from base_sglang.calibration.data import SPLITS

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["table"]:  # python -m research.onpolicy_r2 table OUT.json
        print(table(argv[1]))
        return 0
    ap = argparse.ArgumentParser(prog="onpolicy_r2", description=__doc__.split("\n\n")[0])
    add_eval_args(ap)
    ap.add_argument("--split", default="tune", choices=SPLITS)
    args = ap.parse_args(argv)
    args.argv = argv
    finish_args(ap, args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

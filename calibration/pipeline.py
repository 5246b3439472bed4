"""The calibration run: token windows -> per-layer statistics -> fits -> held-out scores -> Predictor.

Layers are processed in groups small enough that their fp64 statistics fit in cfg.max_stats_gib; each
group makes one pass over the fit windows (the forward stops after the group's last MoE layer) and one
over the held-out windows. A small model is a single group: one pass of each kind.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn
from tqdm.auto import tqdm

from base_sglang.calibration.artifact import assemble
from base_sglang.calibration.collect import LayerStats, capture, run_forward
from base_sglang.calibration.config import CalibrationConfig
from base_sglang.calibration.data import windows
from base_sglang.calibration.fit import HeldoutStats, finish_layer
from base_sglang.core import Predictor
from base_sglang.core.predictor import describe_model_config
from base_sglang.hf import find_moe_blocks


def layer_groups(layers: list[int], per_layer_bytes: int, max_gib: float) -> list[list[int]]:
    per_group = max(1, int(max_gib * 2**30 // max(per_layer_bytes, 1)))
    return [layers[i:i + per_group] for i in range(0, len(layers), per_group)]


def split_windows(doc_ids: list[list[int]], cfg: CalibrationConfig):
    """(fit windows, held-out windows): every heldout_every-th document is held out of the fit."""
    held_docs = [ids for d, ids in enumerate(doc_ids) if d % cfg.heldout_every == cfg.heldout_every - 1]
    fit_docs = [ids for d, ids in enumerate(doc_ids) if d % cfg.heldout_every != cfg.heldout_every - 1]
    n_held = max(1, cfg.num_seqs // cfg.heldout_every)
    held = [w for _, w in windows(held_docs, cfg.seq_len, limit=n_held)]
    fit = [w for _, w in windows(fit_docs, cfg.seq_len, limit=cfg.num_seqs - len(held))]
    if not fit:
        raise ValueError(f"data: no calibration document has {cfg.seq_len} tokens (--seq-len)")
    if not held:  # too few documents to hold some out: score on the last fit windows instead
        held = fit[-max(1, len(fit) // cfg.heldout_every):]
    return fit, held


def _batches(wins: list[list[int]], size: int, device) -> list[torch.Tensor]:
    return [torch.tensor(wins[i:i + size], dtype=torch.long, device=device)
            for i in range(0, len(wins), size)]


def calibrate(model: nn.Module, doc_ids: list[list[int]], cfg: CalibrationConfig,
              model_id: str = "", data_desc: dict | None = None, progress: bool = True) -> Predictor:
    t0 = time.time()
    dev = next(model.parameters()).device
    blocks = find_moe_blocks(model, require=True)
    desc = describe_model_config(model.config)
    E, H, K = int(desc["num_experts"]), int(desc["hidden_size"]), int(desc["top_k"])
    fit_w, held_w = split_windows(doc_ids, cfg)
    fit_batches = _batches(fit_w, cfg.batch_size, dev)
    held_rows = min(cfg.stat_batch, len(held_w))
    held_batches = [b for b in _batches(held_w, held_rows, dev) if b.shape[0] == held_rows]
    budgets = cfg.budgets_for(E, K)
    groups = layer_groups(sorted(blocks), LayerStats.nbytes(E, H), cfg.max_stats_gib)

    fits, fit_stats = {}, {}
    for gi, group in enumerate(groups):
        tag = f"layers {group[0]}-{group[-1]}" + (f" ({gi + 1}/{len(groups)})" if len(groups) > 1 else "")
        accs = {j: LayerStats(E, H, cfg.sere_tokens, device=dev) for j in group}
        with capture(blocks, group, lambda j, x, lg, w, ids, ex, accs=accs: accs[j].update(x, ids, ex)):
            for b in tqdm(fit_batches, desc=f"collect {tag}", disable=not progress):
                run_forward(model, b)
        for j in group:
            fits[j] = finish_layer(accs.pop(j), cfg.ridge, cfg.exfold_lambda, cfg.sere_metric)
            fits[j] = _to_cpu(fits[j])
        held = {j: HeldoutStats(_to_dev(fits[j], dev), budgets) for j in group}
        with capture(blocks, group,
                     lambda j, x, lg, w, ids, ex, held=held: held[j].update(x, w, ids, ex, held_rows)):
            for b in tqdm(held_batches, desc=f"held-out {tag}", disable=not progress):
                run_forward(model, b)
        for j in group:
            fit_stats[str(j)] = {**fits[j].stats, **(held[j].result() if held_batches else {})}
    calibration = {
        **(data_desc or {}),
        "fit_seqs": len(fit_w), "heldout_seqs": len(held_batches) * held_rows,
        "seq_len": cfg.seq_len, "fit_tokens": len(fit_w) * cfg.seq_len,
        "ridge": cfg.ridge, "ridge_rule": "lambda = ridge * tr(Z^T Z) / H per expert, bias unpenalised",
        "target": "log(||E_u(z)||_2 + 1e-6), unweighted routed expert output",
        "rows": "calibration tokens routed to the expert", "stat_batch": held_rows,
        "stat_budgets": list(budgets), "sere_metric": cfg.sere_metric, "sere_tokens": cfg.sere_tokens,
        "exfold_lambda": cfg.exfold_lambda, "layer_groups": len(groups),
        "device": str(dev), "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "seconds": round(time.time() - t0, 1),
    }
    return assemble(model, fits, model_id, calibration, fit_stats)


def _to_cpu(fit):
    for name in ("weight", "bias", "expert_freq", "expert_norm", "sere_sim", "exfold_coef", "exfold_loss"):
        setattr(fit, name, getattr(fit, name).cpu())
    return fit


def _to_dev(fit, dev):
    import copy

    f = copy.copy(fit)
    for name in ("weight", "bias", "expert_norm"):
        setattr(f, name, getattr(fit, name).to(dev))
    return f


def summarize(pred: Predictor) -> str:
    """A per-layer table of the fit statistics."""
    cols = ["r2", "r2_within", "spearman_cost", "spearman_batch", "union_mean"]
    budgets = pred.meta.calibration.get("stat_budgets", [])
    head = f"{'layer':>5} " + " ".join(f"{c:>14}" for c in cols)
    head += "".join(f"  base/oracle@{m:<3}" for m in budgets)
    lines = [head]
    for layer, st in pred.meta.fit_stats.items():
        row = f"{layer:>5} " + " ".join(f"{st.get(c, math.nan):14.3f}" for c in cols)
        for m in budgets:
            b, o = st.get(f"energy_base@{m}", math.nan), st.get(f"energy_oracle@{m}", math.nan)
            row += f"  {b:6.3f}/{o:6.3f}    "
        lines.append(row)
    return "\n".join(lines)

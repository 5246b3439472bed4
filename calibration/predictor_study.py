"""Predictor options for the log-norm of a routed expert's output: held-out quality and serving cost.

    python -m base_sglang.calibration.predictor_study --model DIR --data FILE --out STEM

Every option is a per-(layer, expert) ridge regression of y = log(||E_u(z)|| + 1e-6) on a feature vector
f(z) of the MoE-layer input z (same rows, lambda rule and calibration windows as base-calibrate; fitted on
the calibration split's fit windows, scored on its held-out windows):
  linear  f = z                                         (the shipped predictor)
  linear_w1 / linear_w2 / linear_wc   f = z, each routed pair weighted in the fit by its router weight
          w, by w^2, or by its true removal cost w^2 ||E_u||^2 (normalised per expert): the same
          serving cost as linear, a fit aimed at the pairs the selection's score is made of
  router  f = [z, logsumexp(router logits), log ||z||]  (what the router already has, beyond W_r z)
  diag2   f = [z, z * z]
  quadR   f = [z, upper triangle of s s^T], s = P z, P = top-R principal directions of z (shared)
  rfR     f = [z, silu(P z)], P random [R, H] (shared random features)
Options with R of the expert's own neurons computed exactly (calibration/neuron_features.py; S_u = the R
neurons of largest mean h_j^2 ||d_j||^2 on the fit rows, or of largest variance with --neuron-rule var),
per routed slot:
  neuronR        f = [z, log ||P_S(z)||]          P_S = sum_{j in S_u} h_j d_j, the exact partial output
  neuronR_only   f = [log ||P_S(z)||]             (yhat = a_u log ||P_S|| + b_u)
  nenergyR       f = [z, log Q_S(z)]              Q_S = sum_{j in S_u} h_j^2 ||d_j||^2 (no down product)
  nenergyR_only  f = [log Q_S(z)]
Options with a rank-R sketch W ~ A_R B_R of each expert's stacked [W_g; W_u] (calibration/expert_sketch.py;
h~ = act(A_R B_R z) split into gate and up halves, Q~ = sum_j h~_j^2 ||d_j||^2), per routed slot:
  sketchR        f = [z, log Q~(z)]               A_R B_R = truncated SVD of [W_g; W_u]
  sketchR_only   f = [log Q~(z)]                  (yhat = a_u log Q~ + b_u)
  sketchoR       f = [z, log ||W_d h~(z)||]       (the full down product; sketchoR_only likewise)
  sketchdR       f = [z, log Q~(z)]               A_R B_R = the top-R directions of the expert's
                                                  pre-activations on its fit rows (sketchdR_only,
                                                  sketchdoR likewise)
Options with a TRAINED shared projection (calibration/mlp_predictor.py: full-batch Adam from the ridge fit,
step count chosen on a validation slice of the fit windows, then refitted on all fit windows):
  mlpR      f = [z, silu(P z + q)]             P [R, H], q [R] shared by the layer, heads [a_u, c_u, b_u]
  mlpR_only f = [silu(P z + q)]                (no a_u . z term)
  mlpR_rl   f = [z, silu(P [z, logits] + q)]   (the nonlinearity also reads the router logits)
Writes STEM.json: per layer and option the held-out R^2, Spearman of the removal cost w^2 ||E_u||^2,
retained true removal energy of the top-M by predicted cost (decode batches of B tokens at one position)
and the oracle's, plus each option's serving cost per token (MACs and predictor bytes).

Shape legend: T tokens, K routed slots, E experts, H hidden size, F features, R projection rank.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import torch

from base_sglang.calibration.collect import LOG_EPS, capture, routed_outputs, run_forward
from base_sglang.calibration.config import CalibrationConfig, run_cli
from base_sglang.calibration.expert_sketch import sketch_factors, sketch_features
from base_sglang.calibration.fit import spearman, top_m_mask
from base_sglang.calibration.mlp_predictor import MLPConfig, fit_mlp, mlp_features
from base_sglang.calibration.neuron_features import NEURON_RULES, neuron_features, select_neurons
from base_sglang.calibration.report import stem_path

OPTIONS = ("linear", "router", "diag2", "quad16", "quad32", "rf256", "linear_w1", "linear_w2",
           "linear_wc")
SAMPLE_WEIGHTED = {"linear_w1", "linear_w2", "linear_wc"}
QWEN3_30B_A3B = dict(H=2048, E=128, K=8, I=768)


def neuron_spec(option: str) -> tuple[str, int, bool] | None:
    """(kind "neuron" | "nenergy", r, only) of a neuron option, None for the others."""
    m = re.fullmatch(r"(neuron|nenergy)(\d+)(_only)?", option)
    return (m.group(1), int(m.group(2)), bool(m.group(3))) if m else None


def sketch_spec(option: str) -> tuple[str, str, int, bool] | None:
    """(method "svd" | "data", form "energy" | "out", r, only) of a sketch option, None for the others."""
    m = re.fullmatch(r"sketch(d?)(o?)(\d+)(_only)?", option)
    if m is None:
        return None
    if int(m.group(3)) < 1:
        raise ValueError(f"options: {option} needs a sketch rank R >= 1")
    return ("data" if m.group(1) else "svd", "out" if m.group(2) else "energy", int(m.group(3)),
            bool(m.group(4)))


def column_spec(option: str) -> tuple[tuple, bool] | None:
    """(key of the option's per-slot column, only) of a neuron or sketch option, None for the others."""
    spec = neuron_spec(option)
    if spec is not None:
        return spec[:2], spec[2]
    spec = sketch_spec(option)
    return (spec[:3], spec[3]) if spec is not None else None


def mlp_spec(option: str) -> tuple[int, str] | None:
    """(R, variant "" | "only" | "rl") of a trained-projection option, None for the others."""
    m = re.fullmatch(r"mlp(\d+)(?:_(only|rl))?", option)
    if m is None:
        return None
    if int(m.group(1)) < 1:
        raise ValueError(f"options: {option} needs a rank R >= 1")
    return int(m.group(1)), m.group(2) or ""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="predictor_study", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True, help="output path stem (writes .json)")
    p.add_argument("--options", default=",".join(OPTIONS))
    p.add_argument("--num-seqs", type=int, default=CalibrationConfig.num_seqs)
    p.add_argument("--seq-len", type=int, default=CalibrationConfig.seq_len)
    p.add_argument("--heldout-every", type=int, default=CalibrationConfig.heldout_every)
    p.add_argument("--batch-size", type=int, default=16, help="decode batch B of the energy statistic")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--neuron-rule", default="energy", choices=NEURON_RULES,
                   help="how the neuron options pick S_u on the fit rows")
    p.add_argument("--mlp-steps", type=int, default=MLPConfig.max_steps,
                   help="max full-batch Adam steps of the mlpR options' selection run")
    p.add_argument("--mlp-weight-decay", type=float, default=MLPConfig.weight_decay,
                   help="relative L2 on the mlpR options' heads c_u and projection P")
    return p


def features(option: str, z: torch.Tensor, logits: torch.Tensor, proj: torch.Tensor | None):
    """f(z) [T, F] for one option (a neuron option's per-slot column is passed to ridge separately).
    z [T, H], logits [T, E]."""
    z = z.float()
    spec = column_spec(option)
    if spec is not None:
        return z[:, :0] if spec[1] else z
    if option == "linear" or option in SAMPLE_WEIGHTED:
        return z
    if option == "router":
        lse = torch.logsumexp(logits.float(), 1, keepdim=True)  # [T, 1]
        return torch.cat([z, lse, torch.log(z.norm(dim=1, keepdim=True).clamp_min(1e-12))], 1)
    if option == "diag2":
        return torch.cat([z, z.square()], 1)
    s = z @ proj.T  # [T, R]
    if option.startswith("quad"):
        iu = torch.triu_indices(s.shape[1], s.shape[1])
        return torch.cat([z, (s[:, :, None] * s[:, None, :])[:, iu[0], iu[1]]], 1)
    return torch.cat([z, torch.nn.functional.silu(s)], 1)  # rf


def serving_cost(option: str, H: int, E: int, K: int, I: int | None = None) -> dict:  # noqa: E741
    """MACs per token and predictor bytes (bf16) per layer of each option at hidden H.

    Neuron options (I = expert intermediate size, needed for them) cost per routed slot 2rH MACs for the
    gate/up rows of S plus Hr for the partial down product (nenergy: r, with ||d_j||^2 stored) and the
    ridge; bytes are a bf16 copy of those rows per expert. expert_bytes_fraction = neuron bytes per
    expert / one expert's bytes (3IH); a kernel that gathers the rows from the resident expert weights
    stores nothing extra but still reads that fraction of every expert the batch touches.
    Sketch options cost per routed slot rH + 2Ir (s = B z, then A s) + I (the energy sum, with
    ||d_j||^2 stored; sketchoR: HI for W_d h~ instead) plus the ridge; bytes are A, B and ||d_j||^2
    (sketchoR: W_d) per expert, and expert_bytes_fraction is those over 3IH.
    """
    ms = mlp_spec(option)
    if ms is not None:  # shared P [R, D] (+ q) once per token; per slot a dot product with the head
        R, var = ms
        D = H + (E if var == "rl" else 0)
        head = R + (0 if var == "only" else H)
        return {"features": head, "macs_per_token": R * D + K * head,
                "bytes_per_layer": 2 * (R * D + R + E * (head + 1))}
    sk = sketch_spec(option)
    if sk is not None:
        if I is None:
            raise ValueError(f"options: {option} needs the expert intermediate size")
        _, form, r, only = sk
        sketch = r * H + 2 * I * r + (H * I if form == "out" else I)  # per slot MACs = weights
        lin = 2 if only else H + 2  # ridge weights (z part, the sketch column, bias)
        return {"features": lin - 1, "macs_per_token": K * (sketch + lin - 1),
                "bytes_per_layer": 2 * E * (sketch + lin),
                "expert_bytes_fraction": round(sketch / (3 * I * H), 5)}
    spec = neuron_spec(option)
    if spec is not None:
        if I is None:
            raise ValueError(f"options: {option} needs the expert intermediate size")
        kind, r, only = spec
        neuron = 2 * r * H + (H * r if kind == "neuron" else r)  # per slot MACs = per expert weights
        lin = 2 if only else H + 2  # ridge weights (z part, the neuron column, bias)
        return {"features": lin - 1, "macs_per_token": K * (neuron + lin - 1),
                "bytes_per_layer": 2 * E * (neuron + lin),
                "expert_bytes_fraction": round(neuron / (3 * I * H), 5)}
    R = 0 if option in SAMPLE_WEIGHTED else int("".join(c for c in option if c.isdigit()) or 0)
    extra = {"linear": 0, "router": 2, "diag2": H}.get("linear" if option in SAMPLE_WEIGHTED
                                                       else option)
    if extra is None:
        extra = R * (R + 1) // 2 if option.startswith("quad") else R
    shared = R * H if R else 0  # the shared projection P z, once per token
    return {"features": H + extra, "macs_per_token": shared + K * (H + extra) + (R * R if
            option.startswith("quad") else 0), "bytes_per_layer": 2 * (shared + E * (H + extra + 1))}


def ridge(feats: torch.Tensor, y: torch.Tensor, e: torch.Tensor, tok: torch.Tensor, E: int,
          lam_rel: float, extra: torch.Tensor | None = None,
          sample_w: torch.Tensor | None = None) -> torch.Tensor:
    """theta [E, F+X+1] of the per-expert ridge on rows [f(z_t), extra_slot, 1] (lambda = lam_rel
    tr(Z^T W Z) / F on the F token features; the X per-slot columns extra [T*K, X] and the bias are
    not penalised). sample_w [T*K]: per-row weights of the squared errors (None: all 1); each
    expert's weights are scaled to mean 1, so lambda keeps its meaning."""
    F = feats.shape[1]
    X = 0 if extra is None else extra.shape[1]
    theta = torch.zeros(E, F + X + 1, dtype=torch.float64)
    theta[:, F + X] = float(y.mean())
    for u in range(E):
        sel = e == u
        if not sel.any():
            continue
        parts = [feats[tok[sel]]] + ([extra[sel]] if X else [])
        zu = torch.cat([*parts, feats.new_ones(int(sel.sum()), 1)], 1).double()  # [n, F+X+1]
        yu = y[sel].double()  # [n]
        su = torch.ones_like(yu) if sample_w is None else sample_w[sel].double()
        su = su / su.mean().clamp_min(1e-30)  # [n] mean 1 per expert
        a = (zu * su[:, None]).T @ zu  # [F+X+1, F+X+1]
        if F:
            a[:F, :F] += lam_rel * a[:F, :F].diagonal().sum() / F * torch.eye(F, dtype=torch.float64)
        theta[u] = torch.linalg.lstsq(a, ((zu * su[:, None]).T @ yu)[:, None]).solution[:, 0]
    return theta.float()


def collect(model, blocks, wins: list[list[int]]):
    """layer -> (z [T, H], logits [T, E], w [T, K], ids [T, K], true norms [T, K]) over the windows."""
    acc = {j: [] for j in blocks}

    def fn(j, x, lg, w, ids, ex):
        acc[j].append((x, lg, w, ids.long(), routed_outputs(x, ids, ex).norm(dim=-1)))

    batch = torch.tensor(wins)
    with torch.no_grad(), capture(blocks, sorted(blocks), fn):
        for i in range(0, len(batch), 8):
            run_forward(model, batch[i:i + 8])
    return {j: tuple(torch.cat([a[k] for a in acc[j]]) for k in range(5)) for j in acc}


def layer_metrics(theta, feats, w, ids, norms, seq: int, B: int, budgets, extra=None) -> dict:
    """Held-out R^2 / Spearman / retained energy of one fitted option (extra [T, K, X] per-slot
    columns of a neuron option)."""
    E, F = theta.shape[0], feats.shape[1]
    th = theta[ids]  # [T, K, F+X+1]
    yhat = torch.einsum("tf,tkf->tk", feats, th[..., :F]) + th[..., -1]  # [T, K]
    if extra is not None:
        yhat = yhat + (extra * th[..., F:-1]).sum(-1)
    y = torch.log(norms + LOG_EPS)  # [T, K]
    c_true = w.float().square() * norms.square()  # [T, K]
    c_pred = w.float().square() * torch.exp(2 * yhat)  # [T, K]
    out = {"r2": float(1 - (y - yhat).square().sum() / (y - y.mean()).square().sum()),
           "spearman_cost": spearman(c_pred.reshape(-1), c_true.reshape(-1))}
    for m, (pred, oracle) in retained_energy(c_pred, c_true, ids, E, seq, B, budgets).items():
        out[f"energy_pred@{m}"], out[f"energy_oracle@{m}"] = pred, oracle
    return out


def retained_energy(c_pred, c_true, ids, E: int, seq: int, B: int, budgets) -> dict:
    """M -> (true removal energy kept by the top-M of the predicted batch scores, the oracle's):
    decode batches of B windows of `seq` tokens at one position. c_pred, c_true, ids [T, K]."""
    T = ids.shape[0]
    nb = T // seq // B  # decode batches: B windows at one position
    idx = torch.arange(nb * B * seq).view(nb, B, seq).permute(0, 2, 1).reshape(-1, B)  # [S, B]

    def score(v):  # [T, K] -> [S, E]
        return torch.zeros(idx.shape[0], E).scatter_add_(1, ids[idx].reshape(idx.shape[0], -1),
                                                          v[idx].reshape(idx.shape[0], -1).float())

    d_true, d_pred = score(c_true), score(c_pred)
    union = score(torch.ones_like(c_true)) > 0
    return {m: tuple(float((d_true * top_m_mask(d, m, union)).sum() / d_true.sum())
                     for d in (d_pred, d_true)) for m in budgets}


def summarise(layers: dict, options: list[str], budgets) -> dict:
    """Per option, means over layers: r2 (and min/max), spearman_cost, energy_pred@M, energy_oracle@M,
    and gap_closed@M = (energy_pred - linear's) / (oracle - linear's) when linear was run."""
    out = {}
    for o in options:
        rows = [layers[j][o] for j in layers]
        mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
        s = {"r2": mean["r2"], "r2_min": min(r["r2"] for r in rows),
             "r2_max": max(r["r2"] for r in rows), "spearman_cost": mean["spearman_cost"],
             "spearman_min": min(r["spearman_cost"] for r in rows)}
        for m in budgets:
            s[f"energy_pred@{m}"], s[f"energy_oracle@{m}"] = mean[f"energy_pred@{m}"], mean[f"energy_oracle@{m}"]
        out[o] = s
    if "linear" in out:
        for s in out.values():
            for m in budgets:
                lin, orc = out["linear"][f"energy_pred@{m}"], s[f"energy_oracle@{m}"]
                s[f"gap_closed@{m}"] = (s[f"energy_pred@{m}"] - lin) / (orc - lin) if orc > lin else None
    return out


def print_summary(result: dict, budgets) -> None:
    """One line per option: mean R^2, Spearman, retained energy vs the oracle at M = 2k, gap closed."""
    m = budgets[1] if len(budgets) > 1 else budgets[0]
    print(f"{'option':16s} {'r2':>6s} {'spear':>6s} {'E@' + str(m):>7s} {'oracle':>7s} {'gap':>6s} "
          f"{'bytes/expert':>12s}")
    for o, s in result["summary"].items():
        gap = s.get(f"gap_closed@{m}")
        frac = result["cost"][o].get("expert_bytes_fraction")
        print(f"{o:16s} {s['r2']:6.3f} {s['spearman_cost']:6.3f} {s[f'energy_pred@{m}']:7.4f} "
              f"{s[f'energy_oracle@{m}']:7.4f} {'' if gap is None else f'{gap:6.2f}':>6s} "
              f"{'' if frac is None else f'{frac:.4f}':>12s}")


def mlp_option(option: str, fit, held, cfg: CalibrationConfig, mlp_cfg: MLPConfig, B: int, budgets):
    """Train one mlpR option of one layer on the fit rows and score it on the held-out rows:
    (layer_metrics, training info). fit / held = (z, logits, w, ids, norms) of collect()."""
    R, var = mlp_spec(option)
    z, lg, w, ids, norms = fit
    hz, hlg, hw, hids, hn = held
    T, K = ids.shape
    tok_idx = torch.arange(T).repeat_interleave(K)  # [T*K]
    e, y = ids.reshape(-1), torch.log(norms + LOG_EPS)  # [T*K], [T, K]
    zl = None if var == "only" else z.float()

    def ridge_fit(n: int):  # ridge of the linear part on the first n tokens (no features: the mean)
        m = tok_idx < n
        return ridge(z.float()[:n, :0] if zl is None else zl[:n], y.reshape(-1)[m], e[m], tok_idx[m],
                     lg.shape[1], cfg.ridge)

    def nl_input(zz, ll):  # [T, D]
        return torch.cat([zz.float(), ll.float()], 1) if var == "rl" else zz.float()

    f = fit_mlp(nl_input(z, lg), zl, ids, y, lg.shape[1], R, cfg.ridge, ridge_fit, mlp_cfg, cfg.seq_len)
    feats = mlp_features(nl_input(hz, hlg), None if zl is None else hz, f.proj, f.shift)
    return layer_metrics(f.theta, feats, hw, hids, hn, cfg.seq_len, B, budgets), f.info


def run(args) -> int:
    from base_sglang.calibration.data import read_documents, split_documents, tokenize_documents
    from base_sglang.calibration.pipeline import split_windows
    from base_sglang.calibration.report import environment
    from base_sglang.core.predictor import describe_model_config
    from base_sglang.hf import find_moe_blocks, load_model

    options = [o.strip() for o in args.options.split(",") if o.strip()]
    for o in options:
        if o not in OPTIONS and column_spec(o) is None and mlp_spec(o) is None:
            raise ValueError(f"options: unknown option {o!r}; choose from {OPTIONS} or "
                             f"neuronR / neuronR_only / nenergyR / nenergyR_only (R neurons) or "
                             f"mlpR / mlpR_only / mlpR_rl (trained rank-R projection) or "
                             f"sketchR / sketchR_only / sketchoR / sketchdR / sketchdoR (+ _only) "
                             f"(rank-R sketch of the expert)")
    t0 = time.time()
    model, tok = load_model(args.model, "cpu", "float32")
    blocks = find_moe_blocks(model, require=True)
    desc = describe_model_config(model.config)
    E, K, H = int(desc["num_experts"]), int(desc["top_k"]), int(desc["hidden_size"])
    I = int(blocks[min(blocks)].experts.gate_up_proj.shape[1]) // 2  # noqa: E741
    r_max = max([neuron_spec(o)[1] for o in options if neuron_spec(o)] or [0])
    if r_max > I:
        raise ValueError(f"options: neuron options need R <= the expert intermediate size {I}, "
                         f"got {r_max}")
    sketch_keys = sorted({sketch_spec(o)[:3] for o in options if sketch_spec(o)})  # (method, form, r)
    r_sketch = max([k[2] for k in sketch_keys] or [0])
    if r_sketch > min(2 * I, H):
        raise ValueError(f"options: sketch options need R <= min(2I, H) = {min(2 * I, H)}, "
                         f"got {r_sketch}")
    cfg = CalibrationConfig(num_seqs=args.num_seqs, seq_len=args.seq_len,
                            heldout_every=args.heldout_every)
    mlp_cfg = MLPConfig(max_steps=args.mlp_steps, weight_decay=args.mlp_weight_decay)
    docs = tokenize_documents(tok, split_documents(read_documents(args.data), "calib"))
    fit_w, held_w = split_windows(docs, cfg)
    fit, held = collect(model, blocks, fit_w), collect(model, blocks, held_w)
    budgets = cfg.budgets_for(E, K)
    gen = torch.Generator().manual_seed(0)
    q = QWEN3_30B_A3B
    result = {"layers": {}, "cost": {o: serving_cost(o, H, E, K, I) for o in options},
              "cost_qwen3_30b_a3b": {o: serving_cost(o, q["H"], q["E"], q["K"], q["I"])
                                     for o in options}, "mlp_fit": {}}
    for j in sorted(blocks):
        z, lg, w, ids, norms = fit[j]
        tok_idx = torch.arange(z.shape[0]).repeat_interleave(K)  # [T*K]
        e, y = ids.reshape(-1), torch.log(norms + LOG_EPS).reshape(-1)
        centred = z.float() - z.float().mean(0)
        pcs = torch.linalg.svd(centred, full_matrices=False).Vh  # [H, H] principal directions
        result["layers"][str(j)] = {}
        hz, hlg, hw, hids, hn = held[j]
        neuron_cols = {}  # column key -> (fit column [T*K, 1], held column [T', K, 1])
        if r_max:
            ex = blocks[j].experts
            gu, dn, act = ex.gate_up_proj.detach(), ex.down_proj.detach(), ex.act_fn
            sel = select_neurons(z, ids, gu, dn, r_max, act, args.neuron_rule)  # [E, r_max]
            for r in sorted({neuron_spec(o)[1] for o in options if neuron_spec(o)}):
                fp, fq = neuron_features(z, ids, gu, dn, sel[:, :r], act)  # [T, K] each
                hp, hq = neuron_features(hz, hids, gu, dn, sel[:, :r], act)
                neuron_cols[("neuron", r)] = (fp.reshape(-1, 1), hp[..., None])
                neuron_cols[("nenergy", r)] = (fq.reshape(-1, 1), hq[..., None])
        for method, r in sorted({(k[0], k[2]) for k in sketch_keys}):  # one factorisation each
            ex = blocks[j].experts
            gu, dn, act = ex.gate_up_proj.detach(), ex.down_proj.detach(), ex.act_fn
            fa, fb = sketch_factors(gu, r, method, z, ids)  # [E, 2I, r], [E, r, H]
            out = (method, "out", r) in sketch_keys
            fq, fo = sketch_features(z, ids, fa, fb, dn, act, out)  # [T, K] each (fo None unless out)
            hq, ho = sketch_features(hz, hids, fa, fb, dn, act, out)
            neuron_cols[(method, "energy", r)] = (fq.reshape(-1, 1), hq[..., None])
            if out:
                neuron_cols[(method, "out", r)] = (fo.reshape(-1, 1), ho[..., None])
        for o in options:
            if mlp_spec(o) is not None:
                t1 = time.time()
                result["layers"][str(j)][o], info = mlp_option(o, fit[j], held[j], cfg, mlp_cfg,
                                                               args.batch_size, budgets)
                result["mlp_fit"].setdefault(str(j), {})[o] = {**info,
                                                               "seconds": round(time.time() - t1, 1)}
                continue
            spec = column_spec(o)
            if spec is not None:
                fcol, hcol = neuron_cols[spec[0]]
                theta = ridge(features(o, z, lg, None), y, e, tok_idx, E, cfg.ridge, fcol)
                result["layers"][str(j)][o] = layer_metrics(
                    theta, features(o, hz, hlg, None), hw, hids, hn, cfg.seq_len, args.batch_size,
                    budgets, hcol)
                continue
            r = 0 if o in SAMPLE_WEIGHTED else int("".join(c for c in o if c.isdigit()) or 0)
            proj = (pcs[:r] if o.startswith("quad") else
                    torch.randn(r, H, generator=gen) * 2 / math.sqrt(H)) if r else None
            sw = None
            if o in SAMPLE_WEIGHTED:  # [T*K] per-pair weight of the fit
                wf = w.float().reshape(-1)
                sw = {"linear_w1": wf, "linear_w2": wf.square(),
                      "linear_wc": wf.square() * norms.float().reshape(-1).square()}[o]
            theta = ridge(features(o, z, lg, proj), y, e, tok_idx, E, cfg.ridge, sample_w=sw)
            result["layers"][str(j)][o] = layer_metrics(theta, features(o, hz, hlg, proj), hw, hids,
                                                        hn, cfg.seq_len, args.batch_size, budgets)
        print(j, {o: round(v["r2"], 3) for o, v in result["layers"][str(j)].items()}, flush=True)
    result["summary"] = summarise(result["layers"], options, budgets)
    result["meta"] = {"model": Path(args.model).resolve().name, "command": "predictor_study " +
                      " ".join(args.argv), "fit_windows": len(fit_w), "heldout_windows": len(held_w),
                      "batch_size": args.batch_size, "budgets": list(budgets),
                      "shape": {"H": H, "E": E, "K": K, "I": I},
                      "neuron_rule": f"{args.neuron_rule}: S_u = top-R "
                      f"{'mean' if args.neuron_rule == 'energy' else 'variance'} of h_j^2 ||d_j||^2 "
                      "over the fit rows routed to u",
                      "mlp_config": mlp_cfg.__dict__ if any(mlp_spec(o) for o in options) else None,
                      "sketch": "sketchR: truncated SVD of [W_g; W_u]; sketchdR: top-R directions of "
                      "the expert's pre-activations on its fit rows" if sketch_keys else None,
                      "seconds": round(time.time() - t0, 1), **environment()}
    out = stem_path(args.out, ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print_summary(result, budgets)
    print(f"wrote {out} in {time.time() - t0:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli("predictor_study", run, args)


if __name__ == "__main__":
    sys.exit(main())

"""The evaluation sweep: which settings to run, and how to summarise them at matched cost."""

from __future__ import annotations

import math

import torch

from base_sglang.calibration.decode_eval import Setting, Trace
from base_sglang.core import POLICIES, SelectionConfig
from base_sglang.core.config import BUDGETED_POLICIES as BUDGETED  # kept-set size = budget (M, D)
from base_sglang.core.config import STAT_POLICIES

ALL_POLICIES = tuple(p for p in POLICIES if p != "dense")  # the sweep runs dense as its reference
NEEDS_PREDICTOR = tuple(STAT_POLICIES)
KNOB = {"base": "M", "oracle": "M", "gate_sum": "M", "frequency": "M", "exfold": "D"}
SERE_GRID = [(s, r) for s in (1, 2, 3) for r in (0.0, 0.3)]
LYNX_GRID = [(a, b) for a in (1.0, 4.0) for b in (5,)]


def default_budgets(num_experts: int, top_k: int, union: float) -> list[int]:
    """k, 1.5k, 2k, 3k, 4k, 5k, 6k and half the dense union, below the expert count."""
    ms = {top_k, round(1.5 * top_k), 2 * top_k, 3 * top_k, 4 * top_k, 5 * top_k, 6 * top_k,
          max(1, round(union / 2))}
    return sorted(m for m in ms if 1 <= m < num_experts)


def build_settings(policies: list[str], num_experts: int, top_k: int, budgets: list[int],
                   renorm: str = "native", backfill: bool = True,
                   lynx_taus: tuple[float, ...] = (1.0,)) -> list[Setting]:
    """Dense first, then every policy over its knob grid. renorm/backfill apply to the policies that
    pick a kept set and backfill (base, oracle, gate_sum, frequency, oea, lynx)."""
    out = [Setting("dense", "dense", "-", "-", SelectionConfig(policy="dense"), num_experts)]
    kw = dict(renorm=renorm, backfill=backfill)
    for p in policies:
        if p == "exfold":
            out += [Setting(f"exfold D={m}", p, "D", m, SelectionConfig(policy=p), m) for m in budgets]
        elif p in BUDGETED:
            out += [Setting(f"{p} {KNOB[p]}={m}", p, KNOB[p], m, SelectionConfig(policy=p, **kw), m)
                    for m in budgets]
        elif p == "oea":
            out += [Setting(f"oea k0={k0}", p, "k0", k0, SelectionConfig(policy=p, oea_k0=k0, **kw),
                            num_experts) for k0 in range(1, top_k)]
        elif p == "sere":
            out += [Setting(f"sere S={s} rho={r}", p, "S/rho", f"{s}/{r}",
                            SelectionConfig(policy=p, sere_s=s, sere_rho=r), num_experts)
                    for s, r in SERE_GRID if s < top_k]
        elif p == "lynx":
            out += [Setting(f"lynx a={a} b={b} tau={t:.3g}", p, "alpha/beta/tau", f"{a}/{b}/{t:.3g}",
                            SelectionConfig(policy=p, lynx_alpha=a, lynx_beta=b, lynx_tau=t, **kw),
                            num_experts)
                    for a, b in LYNX_GRID for t in lynx_taus]
        else:
            raise ValueError(f"policies: unknown policy {p!r}; choose from {ALL_POLICIES}")
    return out


def summarize(setting: Setting, traces: list[Trace], dense: list[Trace], seconds: float) -> dict:
    """One result row: cost axis and quality vs the dense run of the same batches."""
    lp = torch.cat([t.logp_target.reshape(-1) for t in traces]).double()
    lp_d = torch.cat([t.logp_target.reshape(-1) for t in dense]).double()
    nll, nll_d = float(-lp.mean()), float(-lp_d.mean())
    diff = (lp_d - lp)  # per-token NLL increase (paired)
    agree = torch.cat([(t.argmax == d.argmax).reshape(-1) for t, d in zip(traces, dense)]).float()
    kl = [t.kl.reshape(-1) for t in traces if t.kl is not None]
    energy = [e for t in traces for e in t.energy]
    kept = [k for t in traces for k in t.kept]
    union = [u for t in traces for u in t.union]
    return {
        "setting": setting.name, "policy": setting.policy, "knob": setting.knob,
        "value": setting.value,
        "experts": _mean(kept), "union": _mean(union),
        "nll": nll, "ppl": math.exp(nll), "dnll": nll - nll_d,
        "dnll_se": float(diff.std() / math.sqrt(max(diff.numel(), 1))),
        "dppl_pct": 100 * (math.exp(nll - nll_d) - 1),
        "agree": float(agree.mean()), "kl": float(torch.cat(kl).mean()) if kl else float("nan"),
        "energy": _mean(energy), "tokens": int(lp.numel()), "seconds": round(seconds, 2),
    }


def _mean(v: list[float]) -> float:
    return float(sum(v) / len(v)) if v else float("nan")


def _interp(xs: list[float], ys: list[float], x: float) -> float | None:
    pts = sorted(zip(xs, ys))
    if not pts or x < pts[0][0] or x > pts[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


def check_targets(rows: list[dict], half_m: int | None, fit_stats: dict | None) -> dict:
    """The issue's targets, evaluated on the rows (true/false plus the numbers behind them)."""
    by = {(r["policy"], r["value"]): r for r in rows}
    base = sorted((r for r in rows if r["policy"] == "base"), key=lambda r: r["experts"])
    out: dict = {"matched_budget": [], "matched_interp": []}
    for b in base:
        m = b["value"]
        others = {p: by[(p, m)]["dppl_pct"] for p in ("gate_sum", "frequency", "exfold")
                  if (p, m) in by}
        orc = by.get(("oracle", m))
        entry = {"M": m, "experts": b["experts"], "base_dppl_pct": b["dppl_pct"], "others": others,
                 "base_best_non_oracle": all(b["dppl_pct"] < v for v in others.values())}
        if orc is not None:
            entry["oracle_dppl_pct"] = orc["dppl_pct"]
            # "within 10% of the oracle": BASE's perplexity increase <= 1.1 x the oracle's increase
            entry["base_within_10pct_of_oracle_increase"] = (
                b["dppl_pct"] <= 1.1 * orc["dppl_pct"] + 1e-9)
            entry["base_over_oracle_increase"] = (
                b["dppl_pct"] / orc["dppl_pct"] if orc["dppl_pct"] > 0 else float("nan"))
        out["matched_budget"].append(entry)
    xs, ys = [b["experts"] for b in base], [b["dppl_pct"] for b in base]
    for r in rows:
        if r["policy"] in ("oea", "sere", "lynx"):
            y = _interp(xs, ys, r["experts"])
            out["matched_interp"].append({
                "setting": r["setting"], "experts": r["experts"], "dppl_pct": r["dppl_pct"],
                "base_interp_dppl_pct": y,
                "base_better": None if y is None else bool(y < r["dppl_pct"])})
    mb = out["matched_budget"]
    interp = [e["base_better"] for e in out["matched_interp"] if e["base_better"] is not None]
    out["all_base_best_non_oracle"] = bool(mb) and all(e["base_best_non_oracle"] for e in mb) and all(interp)
    out["all_base_within_10pct_of_oracle"] = bool(mb) and all(
        e.get("base_within_10pct_of_oracle_increase", False) for e in mb)
    if half_m is not None and ("base", half_m) in by:
        out["half_union_M"] = half_m
        out["half_union_base_dppl_pct"] = by[("base", half_m)]["dppl_pct"]
        out["half_union_within_2pct"] = by[("base", half_m)]["dppl_pct"] <= 2.0
    if fit_stats:
        rho = [st["spearman_cost"] for st in fit_stats.values() if "spearman_cost" in st]
        if rho:
            out["predictor_spearman_min"] = min(rho)
            out["predictor_spearman_ok"] = min(rho) >= 0.9
    return out

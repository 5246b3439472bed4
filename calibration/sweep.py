"""The evaluation sweep: which settings to run, and how to summarise them at matched cost."""

from __future__ import annotations

import math

import torch

from base_sglang.calibration.decode_eval import Setting, Trace
from base_sglang.core import DEFAULT_POLICY, POLICIES, SelectionConfig
from base_sglang.core.config import BUDGETED_POLICIES, ORACLE_OF, STAT_POLICIES, VARIANTS

# the sweep runs dense as its reference; oracle_plus is an evaluation-only policy (below)
ALL_POLICIES = tuple(p for p in POLICIES if p != "dense") + ("oracle_plus",)
# base-eval's default: every policy but the issue-13 variants (they are asked for by name; base_sched
# needs a predictor file with a layer schedule)
DEFAULT_POLICIES = tuple(p for p in ALL_POLICIES if p not in (*VARIANTS, "base_fold"))
NET_POLICIES = tuple(p for p, v in VARIANTS.items() if v[1] == "net")
BUDGETED = BUDGETED_POLICIES + ("oracle_plus",)  # kept-set size = budget (M or D)
NEEDS_PREDICTOR = tuple(STAT_POLICIES)
KNOB = {p: "M" for p in BUDGETED} | {"exfold": "D"}
DEFAULT = DEFAULT_POLICY  # the policy the targets are about
COST_TOL = 0.5  # experts: costs this close count as equal
ORACLES = ("oracle", "oracle_plus")  # oracle = true norms in BASE's score (the paper's ablation);
# oracle_plus = true norms with base_plus's combine rule (the oracle of the default's own objective)
SERE_GRID = [(s, r) for s in (1, 2, 3) for r in (0.0, 0.3)]
LYNX_GRID = [(a, b) for a in (1.0, 4.0) for b in (5,)]


FOLD_DEFAULT = ("native", 1.0, "drop")  # base_fold's knobs: (renorm, fold_max_loss, fold_fallback)


def fold_label(renorm: str, max_loss: float, fallback: str) -> str:
    """Policy label of a base_fold setting: "base_fold" for the defaults, else with its knobs."""
    if (renorm, float(max_loss), fallback) == FOLD_DEFAULT:
        return "base_fold"
    return f"base_fold[{renorm},{max_loss:g},{fallback}]"


def parse_fold_variant(spec: str) -> tuple[str, float, str]:
    """'RENORM:MAX_LOSS:FALLBACK' (e.g. never:1:drop, partial:0.97:backfill) -> a fold variant."""
    parts = spec.split(":")
    if len(parts) != 3:
        raise ValueError(f"fold-variants: expected RENORM:MAX_LOSS:FALLBACK, got {spec!r}")
    try:
        max_loss = float(parts[1])
    except ValueError:
        raise ValueError(f"fold-variants: MAX_LOSS of {spec!r} is not a number") from None
    SelectionConfig(policy="base_fold", renorm=parts[0], fold_max_loss=max_loss,
                    fold_fallback=parts[2])  # validates each field, naming it
    return parts[0], max_loss, parts[2]


def default_budgets(num_experts: int, top_k: int, union: float) -> list[int]:
    """k/2, k, 1.5k, 2k, 3k, 4k, 5k, 6k and half the dense union, below the expert count (k/2 so the
    default's curve reaches down to the cost of OEA k0=1 / Lynx at small batches)."""
    ms = {max(1, top_k // 2), top_k, round(1.5 * top_k), 2 * top_k, 3 * top_k, 4 * top_k, 5 * top_k,
          6 * top_k, max(1, round(union / 2))}
    return sorted(m for m in ms if 1 <= m < num_experts)


def build_settings(policies: list[str], num_experts: int, top_k: int, budgets: list[int],
                   renorm: str = "native", backfill: bool = True,
                   lynx_taus: tuple[float, ...] = (1.0,),
                   max_errors: tuple[float, ...] = (), renorm_alpha: float = 0.5,
                   net_lambda: float = 1.0, net_iters: int = 2,
                   fold_variants: tuple[tuple[str, float, str], ...] = (FOLD_DEFAULT,)
                   ) -> list[Setting]:
    """Dense first, then every policy over its knob grid. renorm/backfill apply to the policies that
    pick a kept set and backfill (base, oracle, gate_sum, frequency, oea, lynx). max_errors adds
    base_plus under error-targeted budgets (policy label "base_plus_err", no expert cap).
    fold_variants: base_fold's (renorm, fold_max_loss, fold_fallback) settings; each but the default
    runs under its own policy label fold_label(...)."""
    out = [Setting("dense", "dense", "-", "-", SelectionConfig(policy="dense"), num_experts)]
    kw = dict(renorm=renorm, backfill=backfill, renorm_alpha=renorm_alpha)
    # oracle_plus runs the core's oracle (true norms) under base_plus's combine rule
    plus_kw = dict(renorm="partial" if renorm == "native" else renorm, backfill=backfill,
                   renorm_alpha=renorm_alpha)
    for p in policies:
        if p == "oracle_plus":
            out += [Setting(f"{p} M={m}", p, "M", m, SelectionConfig(policy="oracle", **plus_kw), m)
                    for m in budgets]
        elif p in NET_POLICIES:
            out += [Setting(f"{p} M={m}", p, "M", m, SelectionConfig(
                policy=p, net_lambda=net_lambda, net_iters=net_iters, **kw), m) for m in budgets]
        elif p == "base_fold":
            for renorm_f, max_loss, fallback in fold_variants:
                label = fold_label(renorm_f, max_loss, fallback)
                cfg = dict(policy=p, renorm=renorm_f, renorm_alpha=renorm_alpha,
                           fold_max_loss=max_loss, fold_fallback=fallback)
                out += [Setting(f"{label} M={m}", label, "M", m, SelectionConfig(**cfg), m)
                        for m in budgets]
        elif p == "exfold":
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
    for eps in max_errors:
        if not 0 <= eps <= 1:
            raise ValueError(f"max_errors: each bound must be in [0, 1], got {eps}")
        out.append(Setting(f"base_plus err={eps:g}", "base_plus_err", "max_error", eps,
                           SelectionConfig(policy="base_plus", **kw), num_experts, max_error=eps))
    return out


def summarize(setting: Setting, traces: list[Trace], dense: list[Trace], seconds: float) -> dict:
    """One result row: cost axis and quality vs the dense run of the same batches."""
    lp = torch.cat([t.logp_target.reshape(-1) for t in traces]).double()
    lp_d = torch.cat([t.logp_target.reshape(-1) for t in dense]).double()
    nll, nll_d = float(-lp.mean()), float(-lp_d.mean())
    diff = token_increase(traces, dense)
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


def token_increase(traces: list[Trace], dense: list[Trace]) -> torch.Tensor:
    """[N] float64: each scored token's NLL increase over the dense run of the same batches. Every
    setting scores the same tokens (teacher forcing), so two settings' arrays pair token by token."""
    lp = torch.cat([t.logp_target.reshape(-1) for t in traces]).double()
    lp_d = torch.cat([t.logp_target.reshape(-1) for t in dense]).double()
    return lp_d - lp


def _mean(v: list[float]) -> float:
    return float(sum(v) / len(v)) if v else float("nan")


def _interp_weights(xs: list[float], ys: list[float], x: float,
                    tol: float = COST_TOL) -> tuple[int, int, float] | None:
    """(i0, i1, a): the point at cost x on the piecewise-linear curve through (xs, ys) (sorted by
    cost, then y) is ys[i0] + (ys[i1] - ys[i0]) * a; None outside the measured range. A cost within
    tol of an end takes that end (budgets above the union execute slightly fewer experts than M)."""
    order = sorted(range(len(xs)), key=lambda i: (xs[i], ys[i]))
    if not order or x < xs[order[0]] - tol or x > xs[order[-1]] + tol:
        return None
    if x <= xs[order[0]]:
        return order[0], order[0], 0.0
    for i0, i1 in zip(order, order[1:]):
        x0, x1 = xs[i0], xs[i1]
        if x0 <= x <= x1:
            return (i0, i0, 0.0) if x1 == x0 else (i0, i1, (x - x0) / (x1 - x0))
    return order[-1], order[-1], 0.0


def _interp(xs: list[float], ys: list[float], x: float, tol: float = COST_TOL) -> float | None:
    """y at cost x on the piecewise-linear curve (xs, ys) (_interp_weights' rule)."""
    w = _interp_weights(xs, ys, x, tol)
    if w is None:
        return None
    i0, i1, _a = w
    return ys[i0] if i0 == i1 else ys[i0] + (ys[i1] - ys[i0]) * (x - xs[i0]) / (xs[i1] - xs[i0])


def paired_z(d_a: torch.Tensor, d_b: torch.Tensor) -> float:
    """mean(d_a - d_b) over its standard error, for two per-token increase arrays of the same tokens
    (positive: a's increase is larger). 0 where the two are identical."""
    diff = (d_a.double() - d_b.double())
    se = float(diff.std() / math.sqrt(diff.numel())) if diff.numel() > 1 else 0.0
    return float(diff.mean()) / se if se > 0 else 0.0


def _significant(diff: float | None, se_a: float | None, se_b: float | None) -> bool | None:
    if diff is None or se_a is None or se_b is None or math.isnan(diff):
        return None
    return abs(diff) > 2 * math.sqrt(se_a ** 2 + se_b ** 2)


def check_targets(rows: list[dict], half_m: int | None, fit_stats: dict | None,
                  top_k: int | None = None, default: str = DEFAULT,
                  tokens: dict[str, torch.Tensor] | None = None) -> dict:
    """The targets, evaluated on the rows (true/false plus the numbers behind them).

    ref = `default` when the rows hold it, else the paper's "base". Per budget M of ref: its increase
    against the paper's BASE and both oracles; "within 10%" means ref's perplexity increase <= 1.1 x
    the oracle's, checked at every M >= top_k. Every other policy's row is compared with ref's curve
    linearly interpolated at that row's cost (experts executed): it beats ref when its increase is
    lower there (rows outside ref's measured cost range cannot be compared and are listed as None).
    "significant" marks a difference of more than two standard errors of the two mean NLL increases
    (sqrt(se_a^2 + se_b^2), unpaired, so conservative). With `tokens` (setting name -> per-token
    increase, `token_increase`) every comparison also gets its paired z (add_paired).
    """
    ref = default if any(r["policy"] == default for r in rows) else "base"
    by = {(r["policy"], r["value"]): r for r in rows}
    curve = sorted((r for r in rows if r["policy"] == ref), key=lambda r: r["experts"])
    xs, ys = [r["experts"] for r in curve], [r["dppl_pct"] for r in curve]
    ys_nll = [r.get("dnll", float("nan")) for r in curve]
    ys_se = [r.get("dnll_se", float("nan")) for r in curve]
    out: dict = {"policy": ref, "matched_budget": [], "matched_interp": []}
    for b in curve:
        m = b["value"]
        entry = {"M": m, "experts": b["experts"], "dppl_pct": b["dppl_pct"],
                 "dnll_se": b.get("dnll_se")}
        if ref != "base" and ("base", m) in by:
            entry["paper_base_dppl_pct"] = by[("base", m)]["dppl_pct"]
        for orc in ORACLES:
            o = by.get((orc, m))
            if o is None:
                continue
            entry[f"{orc}_dppl_pct"] = o["dppl_pct"]
            entry[f"{orc}_gap_significant"] = _significant(b.get("dnll", 0) - o.get("dnll", 0),
                                                           b.get("dnll_se"), o.get("dnll_se"))
            entry[f"within_10pct_of_{orc}"] = b["dppl_pct"] <= 1.1 * o["dppl_pct"] + 1e-9
            entry[f"over_{orc}"] = b["dppl_pct"] / o["dppl_pct"] if o["dppl_pct"] > 0 else float("nan")
        out["matched_budget"].append(entry)
    for r in rows:
        if r["policy"] in ("dense", ref, *ORACLES, *ORACLE_OF.values(), f"{ref}_err"):
            # oracles are references, not competitors; _err: the default, error-targeted
            continue
        y = _interp(xs, ys, r["experts"])
        y_nll = _interp(xs, ys_nll, r["experts"])
        y_se = _interp(xs, ys_se, r["experts"])
        margin = None if y_nll is None else y_nll - r.get("dnll", float("nan"))
        beats = None if y is None else bool(r["dppl_pct"] < y)
        out["matched_interp"].append({
            "setting": r["setting"], "policy": r["policy"], "experts": r["experts"],
            "dppl_pct": r["dppl_pct"], "ref_interp_dppl_pct": y, "dnll_margin": margin,
            "beats_ref": beats,
            "significant": None if y is None else _significant(margin, y_se, r.get("dnll_se"))})
    checked = [e for e in out["matched_budget"] if top_k is None or e["M"] >= top_k]
    for orc in ORACLES:
        flags = [e[f"within_10pct_of_{orc}"] for e in checked if f"within_10pct_of_{orc}" in e]
        out[f"all_within_10pct_of_{orc}"] = bool(flags) and all(flags)
    beats = [e["beats_ref"] for e in out["matched_interp"] if e["beats_ref"] is not None]
    out["unbeaten"] = bool(curve) and not any(beats)
    out["beaten_by"] = [e["setting"] for e in out["matched_interp"] if e["beats_ref"]]
    out["beaten_significantly_by"] = [e["setting"] for e in out["matched_interp"]
                                      if e["beats_ref"] and e["significant"]]
    out["own_oracle"] = {p: own_oracle(rows, p, top_k) for p in ORACLE_OF
                         if any(r["policy"] == p for r in rows)}
    if half_m is not None and (ref, half_m) in by:
        out["half_union_M"] = half_m
        out["half_union_dppl_pct"] = by[(ref, half_m)]["dppl_pct"]
        out["half_union_within_2pct"] = by[(ref, half_m)]["dppl_pct"] <= 2.0
    if fit_stats:
        rho = [st["spearman_cost"] for st in fit_stats.values() if "spearman_cost" in st]
        if rho:
            out["predictor_spearman_min"] = min(rho)
            out["predictor_spearman_ok"] = min(rho) >= 0.9
    if tokens is not None:
        add_paired(out, rows, tokens)
    return out


def add_paired(checks: dict, rows: list[dict], tokens: dict[str, torch.Tensor]) -> None:
    """Paired z of the checks' comparisons, in place, from the per-token increases of the settings
    (all score the same tokens, so the difference is taken token by token; its standard error is far
    below the unpaired sqrt(se_a^2 + se_b^2) because the settings' errors are strongly correlated).
    - matched_budget: `{oracle}_paired_z` = z of (ref - oracle) at the same M (> 2: ref is worse);
    - matched_interp: `paired_z` = z of (ref's curve at the row's cost - row), the curve's per-token
      increase interpolated like its mean (_interp_weights); > 2: the row is lower (beats ref), < -2:
      ref is lower; `significant_paired` = |z| > 2; `beaten_significantly_by_paired` the settings that
      beat ref by more than two paired standard errors;
    - own_oracle: each per-M entry's `paired_z` against its oracle.
    A comparison whose settings lack an array is left without a paired field."""
    ref = checks["policy"]
    by = {(r["policy"], r["value"]): r for r in rows}
    curve = sorted((r for r in rows if r["policy"] == ref), key=lambda r: r["experts"])
    xs, ys = [r["experts"] for r in curve], [r["dppl_pct"] for r in curve]

    def arr(r):
        return None if r is None else tokens.get(r["setting"])

    for e in checks["matched_budget"]:
        d_ref = arr(by.get((ref, e["M"])))
        for orc in ORACLES:
            d_o = arr(by.get((orc, e["M"])))
            if d_ref is not None and d_o is not None:
                e[f"{orc}_paired_z"] = paired_z(d_ref, d_o)
    have_curve = all(arr(r) is not None for r in curve)
    for e in checks["matched_interp"]:
        d_r = tokens.get(e["setting"])
        w = _interp_weights(xs, ys, e["experts"]) if have_curve else None
        if d_r is None or w is None:
            continue
        i0, i1, a = w
        d0, d1 = arr(curve[i0]).double(), arr(curve[i1]).double()
        e["paired_z"] = paired_z(d0 + (d1 - d0) * a, d_r)
        e["significant_paired"] = abs(e["paired_z"]) > 2
    checks["beaten_significantly_by_paired"] = [
        e["setting"] for e in checks["matched_interp"] if e["beats_ref"] and e.get("significant_paired")]
    for p, own in checks.get("own_oracle", {}).items():
        for e in own["per_M"]:
            d_p, d_o = arr(by.get((p, e["M"]))), arr(by.get((own["oracle"], e["M"])))
            if d_p is not None and d_o is not None:
                e["paired_z"] = paired_z(d_p, d_o)
    checks["paired"] = True


def own_oracle(rows: list[dict], policy: str, top_k: int | None = None) -> dict:
    """policy's increase against its own true-norm oracle (ORACLE_OF) at each budget M: ratio, the
    10 % flag (checked at M >= top_k) and whether the gap exceeds two standard errors."""
    orc = ORACLE_OF[policy]
    by = {(r["policy"], r["value"]): r for r in rows}
    per_m = []
    for r in sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["value"]):
        o = by.get((orc, r["value"]))
        if o is None:
            continue
        per_m.append({"M": r["value"], "dppl_pct": r["dppl_pct"], "oracle_dppl_pct": o["dppl_pct"],
                      "over": r["dppl_pct"] / o["dppl_pct"] if o["dppl_pct"] > 0 else float("nan"),
                      "within_10pct": r["dppl_pct"] <= 1.1 * o["dppl_pct"] + 1e-9,
                      "significant": _significant(r.get("dnll", 0) - o.get("dnll", 0),
                                                  r.get("dnll_se"), o.get("dnll_se"))})
    checked = [e["within_10pct"] for e in per_m if top_k is None or e["M"] >= top_k]
    return {"oracle": orc, "per_M": per_m, "all_within_10pct": bool(checked) and all(checked)}


def merge(out_path: str, paths: list[str]) -> dict:
    """Rows of the first file plus those of the others that it lacks (same (policy, value)); the
    first file's meta, with where every row came from; checks recomputed, also with each issue-13
    variant as the reference (checks_by_ref). The files must score the same windows."""
    import json

    from base_sglang.calibration.report import read_tokens, write_tokens

    files = [json.loads(open(p).read()) for p in paths]
    arrays = [read_tokens(p) for p in paths]
    tokens = {} if all(a is not None for a in arrays) else None  # paired only when every file has them
    base = files[0]
    keys = {(r["policy"], r["value"]) for r in base["rows"]}
    rows = list(base["rows"])
    if tokens is not None:
        tokens.update({r["setting"]: arrays[0][r["setting"]] for r in rows if r["setting"] in arrays[0]})
    for path, res, arr in zip(paths[1:], files[1:], arrays[1:]):
        if res["meta"]["settings"].get("batch_size") != base["meta"]["settings"].get("batch_size") or \
                res["meta"].get("model") != base["meta"].get("model"):
            raise ValueError(f"merge: {path} scores another model or batch size than {paths[0]}")
        dense_a = next(r for r in base["rows"] if r["policy"] == "dense")
        dense_b = next(r for r in res["rows"] if r["policy"] == "dense")
        if abs(dense_a["nll"] - dense_b["nll"]) > 1e-9 or dense_a["tokens"] != dense_b["tokens"]:
            raise ValueError(f"merge: {path} scores other windows than {paths[0]} (dense nll differs)")
        for r in res["rows"]:
            if (r["policy"], r["value"]) not in keys:
                rows.append(dict(r, source=path))
                keys.add((r["policy"], r["value"]))
                if tokens is not None and r["setting"] in arr:
                    tokens[r["setting"]] = arr[r["setting"]]
    top_k = base["meta"].get("top_k")
    half_m = base.get("checks", {}).get("half_union_M")
    meta = dict(base["meta"], merged_from=[{"path": p, "commit": f["meta"].get("commit"),
                                            "command": f["meta"].get("command")}
                                           for p, f in zip(paths, files)])
    res = {"meta": meta, "rows": rows, "checks": check_targets(rows, half_m, None, top_k=top_k, tokens=tokens),
           "checks_by_ref": {p: check_targets(rows, None, None, top_k=top_k, default=p, tokens=tokens)
                             for p in ORACLE_OF if p != DEFAULT and any(r["policy"] == p for r in rows)}}
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1, default=lambda x: None if isinstance(x, float) else str(x))
    if tokens is not None:
        write_tokens(out_path, tokens)
    return res


def recheck(paths: list[str]) -> None:
    """Recompute the target checks of base-eval JSON files from their rows (in place), with the
    paired z where the run's per-token increases sit next to the file."""
    import json
    from pathlib import Path

    from base_sglang.calibration.report import read_tokens

    for path in paths:
        res = json.loads(open(path).read())
        old = res.get("checks", {})
        tokens = read_tokens(path)
        if tokens is None and old.get("paired"):
            print(f"{path}: no {Path(path).stem}.tokens.safetensors next to it: the paired z of its "
                  "checks cannot be recomputed and are dropped (rerun base-eval to get them back)")
        res["checks"] = check_targets(res["rows"], old.get("half_union_M"), None,
                                      top_k=res["meta"].get("top_k"), tokens=tokens)
        for key in ("predictor_spearman_min", "predictor_spearman_ok"):
            if key in old:
                res["checks"][key] = old[key]
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        print(f"{path}: unbeaten {res['checks']['unbeaten']}, within 10% of the oracle "
              f"{res['checks']['all_within_10pct_of_oracle']}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["merge"]:
        if len(sys.argv) < 5:
            raise SystemExit("usage: python -m base_sglang.calibration.sweep merge OUT.json NEW.json "
                             "OLD.json...")
        merge(sys.argv[2], sys.argv[3:])
    else:
        recheck(sys.argv[1:])

"""Markdown tables for BENCHMARKS.md from base-eval and predictor_study result files (no recomputation).

    python -m base_sglang.calibration.tables quality FILE.json...   # quality vs budget, per file
    python -m base_sglang.calibration.tables targets FILE.json...   # the issue-13 targets, one row per file
    python -m base_sglang.calibration.tables errors FILE.json...    # error bound vs measured, all files
    python -m base_sglang.calibration.tables study FILE.json...     # predictor options per layer
    python -m base_sglang.calibration.tables variants FILE.json...  # issue-13 variants vs base_plus, per file
    python -m base_sglang.calibration.tables vtargets FILE.json...  # the variants' targets, one row each
    python -m base_sglang.calibration.tables fold FILE.json...      # base_fold settings vs base_plus
    python -m base_sglang.calibration.tables foldsum FILE.json...   # the same, one row per file/setting

Every number is read from the files' rows and checks (calibration/sweep.py check_targets); nothing is
re-measured here.
"""

from __future__ import annotations

import json
import math
import sys

BUDGET_COLS = ("base_plus", "base", "oracle", "oracle_plus", "gate_sum", "exfold", "frequency")
KNOB_POLICIES = ("oea", "sere", "lynx")
# ORACLE_OF keys besides base_plus (base_floor / oracle_floor: rows of the tune run, code removed)
VARIANT_POLICIES = ("base_net", "base_floor", "base_sched")
# the other policies (a variant "beaten by a baseline" means one of these, at equal cost)
BASELINES = ("base", "gate_sum", "frequency", "exfold", "oea", "sere", "lynx")


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _f(x, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}f}"


def _pct(x) -> str:
    """Perplexity increase in %, with more digits where it is small."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}"


def header(res: dict) -> str:
    m, s = res["meta"], res["meta"]["settings"]
    dense = next(r for r in res["rows"] if r["policy"] == "dense")
    return (f"{m['model']} (E={m['num_experts']}, top-{m['top_k']}), B = {s['batch_size']}: "
            f"{s['num_batches']} x {s['batch_size']} windows, prefix {s['prefix']}, {s['steps']} steps, "
            f"{dense['tokens']} scored tokens per setting; dense ppl {dense['ppl']:.3f}, dense union "
            f"{m['dense_union']:.1f} experts; {m['seconds']:.0f} s; commit `{m['commit']}`"
            f"{' (dirty)' if m.get('dirty') else ''}, torch {m['torch']}, transformers "
            f"{m.get('transformers') or '?'}")


def quality(res: dict) -> str:
    """Increase at each budget M for the budgeted policies, ratio to both oracles, then knob policies."""
    by = {(r["policy"], r["value"]): r for r in res["rows"]}
    budgets = sorted({r["value"] for r in res["rows"] if r["policy"] == "base_plus"})
    top_k = res["meta"]["top_k"]
    out = [header(res), "",
           "| M (= D) | " + " | ".join(BUDGET_COLS) + " | base_plus / oracle | base_plus / oracle_plus |",
           "|---:|" + "---:|" * (len(BUDGET_COLS) + 2)]
    for m in budgets:
        cells = [_pct(by[(p, m)]["dppl_pct"]) if (p, m) in by else "-" for p in BUDGET_COLS]
        ratios = []
        for orc in ("oracle", "oracle_plus"):
            o, b = by.get((orc, m)), by.get(("base_plus", m))
            r = b["dppl_pct"] / o["dppl_pct"] if o and b and o["dppl_pct"] > 0 else float("nan")
            mark = "" if m < top_k or math.isnan(r) else (" ok" if r <= 1.1 + 1e-9 else " **miss**")
            ratios.append(f"{_f(r, 2)}{mark}")
        label = f"{m}" + (" (< k)" if m < top_k else "")
        out.append(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    interp = {e["setting"]: e for e in res["checks"]["matched_interp"]}
    out += ["", "| setting | experts | ppl increase % | base_plus at that cost % | beats base_plus |",
            "|---|---:|---:|---:|---|"]
    for r in res["rows"]:
        if r["policy"] not in KNOB_POLICIES:
            continue
        e = interp.get(r["setting"], {})
        beats = e.get("beats_ref")
        flag = "-" if beats is None else ("**yes**" + (" (> 2 SE)" if e.get("significant") else
                                                        " (within 2 SE)") if beats else "no")
        if "paired_z" in e:
            flag += f", paired z {e['paired_z']:+.1f}"
        out.append(f"| {r['setting']} | {r['experts']:.1f} | {_pct(r['dppl_pct'])} | "
                   f"{_pct(e.get('ref_interp_dppl_pct'))} | {flag} |")
    err = [r for r in res["rows"] if r["policy"] == "base_plus_err"]
    if err:
        out += ["", "| max_error (predicted relative error bound) | experts | ppl increase % | "
                    "base_plus at that cost % | agree | KL |", "|---:|---:|---:|---:|---:|---:|"]
        for r in err:
            e = interp.get(r["setting"])  # error rows are not compared; interpolate here for reference
            y = _interp_ref(res, r["experts"]) if e is None else e.get("ref_interp_dppl_pct")
            out.append(f"| {r['value']:g} | {r['experts']:.1f} | {_pct(r['dppl_pct'])} | {_pct(y)} | "
                       f"{r['agree']:.3f} | {_f(r['kl'], 4)} |")
    return "\n".join(out)


def _interp_ref(res: dict, x: float):
    from base_sglang.calibration.sweep import _interp

    curve = sorted((r for r in res["rows"] if r["policy"] == "base_plus"), key=lambda r: r["experts"])
    return _interp([r["experts"] for r in curve], [r["dppl_pct"] for r in curve], x)


def targets(results: list[dict]) -> str:
    """One row per file: within 10 % of each oracle at every M >= k, and unbeaten at equal cost."""
    out = ["| model | B | within 10 % of oracle (M >= k) | within 10 % of oracle_plus (M >= k) | "
           "unbeaten at equal or lower cost | beaten by (> 2 SE, unpaired; paired) |",
           "|---|---:|---|---|---|---|"]
    for res in results:
        c, k = res["checks"], res["meta"]["top_k"]
        cells = []
        for orc in ("oracle", "oracle_plus"):
            es = [e for e in c["matched_budget"] if e["M"] >= k and f"over_{orc}" in e]
            worst = max(es, key=lambda e: e[f"over_{orc}"]) if es else None
            misses = [e["M"] for e in es if not e[f"within_10pct_of_{orc}"]]
            if worst is None:
                cells.append("-")
                continue
            sig = [e["M"] for e in es if not e[f"within_10pct_of_{orc}"] and e.get(f"{orc}_gap_significant")]
            paired = [e for e in es if not e[f"within_10pct_of_{orc}"] and f"{orc}_paired_z" in e]
            cells.append(("met" if c[f"all_within_10pct_of_{orc}"] else "**missed**") +
                         f": worst {worst[f'over_{orc}']:.2f}x at M={worst['M']} "
                         f"({_pct(worst['dppl_pct'])} vs {_pct(worst[f'{orc}_dppl_pct'])} %)" +
                         (f"; over 1.1x at M = {', '.join(map(str, misses))}" if misses else "") +
                         (f" (gap > 2 SE at M = {', '.join(map(str, sig))})" if misses and sig else
                          " (every gap within 2 SE)" if misses else "") +
                         ("; paired z " + ", ".join(f"{e[f'{orc}_paired_z']:+.1f} at {e['M']}" for e in paired)
                          if paired else ""))
        beaten = c.get("beaten_by", [])
        sig = c.get("beaten_significantly_by", [])
        interp = {e["setting"]: e for e in c["matched_interp"]}
        detail = []
        for name in beaten:
            e = interp[name]
            detail.append(f"{name} ({e['experts']:.1f} exp.: {_pct(e['dppl_pct'])} vs "
                          f"{_pct(e['ref_interp_dppl_pct'])} %" +
                          (f", z {e['paired_z']:+.1f}" if "paired_z" in e else "") + ")")
        s = res["meta"]["settings"]
        sig_cell = ", ".join(sig) if sig else "none"
        if c.get("paired"):
            psig = c.get("beaten_significantly_by_paired", [])
            sig_cell += "; paired: " + (", ".join(psig) if psig else "none")
        out.append(f"| {res['meta']['model']} | {s['batch_size']} | {cells[0]} | {cells[1]} | "
                   f"{'met' if c['unbeaten'] else '**missed**: ' + '; '.join(detail)} | {sig_cell} |")
    return "\n".join(out)


def errors(results: list[dict]) -> str:
    """Error-targeted budgets across files: per bound, experts executed and measured ppl increase."""
    eps = sorted({r["value"] for res in results for r in res["rows"] if r["policy"] == "base_plus_err"})
    cols = [f"{res['meta']['model']} B={res['meta']['settings']['batch_size']}" for res in results]
    out = ["| max_error | " + " | ".join(cols) + " |", "|---:|" + "---|" * len(cols),
           ]
    for e in eps:
        cells = []
        for res in results:
            r = next((r for r in res["rows"] if r["policy"] == "base_plus_err" and r["value"] == e), None)
            cells.append("-" if r is None else f"{_pct(r['dppl_pct'])} % @ {r['experts']:.1f}")
        out.append(f"| {e:g} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _oracle_of(policy: str) -> str:
    """base_plus -> oracle_plus, base_X -> oracle_X (also for rows of variants since removed)."""
    return "oracle_plus" if policy == "base_plus" else "oracle_" + policy.removeprefix("base_")


def _own_oracle_cell(e: dict | None) -> str:
    if e is None or e.get("over") is None or math.isnan(e["over"]):
        return "-"
    return f"{e['over']:.2f}" + (" ok" if e["within_10pct"] else " **miss**")


def variants(res: dict) -> str:
    """Per budget M: base_plus, oracle_plus and each variant with its oracle (ratio to it). The
    variants execute M experts like base_plus (vtargets compares them at matched cost)."""
    rows = res["rows"]
    present = [p for p in VARIANT_POLICIES if any(r["policy"] == p for r in rows)]
    by = {(r["policy"], r["value"]): r for r in rows}
    own = res["checks"].get("own_oracle", {})
    budgets = sorted({r["value"] for r in rows if r["policy"] in ("base_plus", *present)})
    top_k = res["meta"]["top_k"]
    cols = ["base_plus", "oracle_plus"] + [c for p in present for c in (p, _oracle_of(p))]
    ratio_cols = ["base_plus"] + present
    out = [header(res), "",
           "| M | " + " | ".join(cols) + " | " +
           " | ".join(f"{p} / {_oracle_of(p)}" for p in ratio_cols) + " |",
           "|---:|" + "---:|" * (len(cols) + len(ratio_cols))]
    for m in budgets:
        cells = [_pct(by[(p, m)]["dppl_pct"]) if (p, m) in by else "-" for p in cols]
        ratios = []
        for p in ratio_cols:
            e = next((x for x in own.get(p, {}).get("per_M", []) if x["M"] == m), None)
            ratios.append(_own_oracle_cell(e) if m >= top_k else
                          (_f(e["over"], 2) if e and e.get("over") is not None else "-"))
        label = f"{m}" + (" (< k)" if m < top_k else "")
        out.append(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return "\n".join(out)


def vtargets(results: list[dict]) -> str:
    """One row per (file, variant): within 10 % of its own oracle at M >= k, where it is lower / higher
    than base_plus at matched cost (> 2 SE marked), and whether the baselines beat it (merged files)."""
    out = ["| model | B | policy | within 10 % of its oracle (M >= k) | lower than base_plus at "
           "matched cost (M) | not lower (M) | beaten by a baseline (paper's BASE, gate_sum, frequency, "
           "ExFold, OEA, SERE, Lynx) |", "|---|---:|---|---|---|---|---|"]
    for res in results:
        c, k = res["checks"], res["meta"]["top_k"]
        interp = {e["setting"]: e for e in c["matched_interp"]}
        for p in VARIANT_POLICIES:
            own = c.get("own_oracle", {}).get(p)
            if own is None:
                continue
            es = [e for e in own["per_M"] if e["M"] >= k and e.get("over") is not None]
            worst = max(es, key=lambda e: e["over"]) if es else None
            cell = "-" if worst is None else (
                ("met" if own["all_within_10pct"] else "**missed**") +
                f": worst {worst['over']:.2f}x at M={worst['M']}")
            lower, higher = [], []
            for r in res["rows"]:
                e = interp.get(r["setting"]) if r["policy"] == p else None
                if e is None or e.get("beats_ref") is None:
                    continue
                tag = f"{r['value']}" + ("*" if e.get("significant") else "")
                (lower if e["beats_ref"] else higher).append(tag)
            ref = res.get("checks_by_ref", {}).get(p)
            beaten = "-"
            if ref is not None:
                hits = [e for e in ref["matched_interp"] if e["beats_ref"] and e["policy"] in BASELINES]
                beaten = "; ".join(f"{e['setting']} ({e['experts']:.1f} exp.: {_pct(e['dppl_pct'])} vs "
                                   f"{_pct(e['ref_interp_dppl_pct'])} %)" +
                                   (" > 2 SE" if e["significant"] else "") for e in hits) or "none"
            s = res["meta"]["settings"]
            out.append(f"| {res['meta']['model']} | {s['batch_size']} | {p} | {cell} | "
                       f"{', '.join(lower) or 'none'} | {', '.join(higher) or 'none'} | {beaten} |")
    return "\n".join(out) + "\n\n(* = difference larger than two standard errors)"


def _diff_cell(r: dict | None, ref: dict | None) -> str:
    """Relative change of the increase against ref, then the NLL difference +- two standard errors
    (unpaired, as check_targets), "*" when larger."""
    if r is None or ref is None:
        return "-"
    d = r["dnll"] - ref["dnll"]
    band = 2 * math.sqrt(r["dnll_se"] ** 2 + ref["dnll_se"] ** 2)
    rel = 100 * (r["dppl_pct"] / ref["dppl_pct"] - 1) if ref["dppl_pct"] > 0 else float("nan")
    return (f"{_f(rel)} %{' *' if abs(d) > band else ''} ({d:+.4f} ± {band:.4f})")


def fold(res: dict) -> str:
    """Per budget M: base_plus, every base_fold setting (policy labels base_fold...), exfold (D = M)
    and oracle_plus, then each base_fold setting against base_plus at the same M (the same kept set,
    so the same experts executed)."""
    rows = res["rows"]
    by = {(r["policy"], r["value"]): r for r in rows}
    folds = list(dict.fromkeys(r["policy"] for r in rows if r["policy"].startswith("base_fold")))
    budgets = sorted({r["value"] for r in rows if r["policy"] in ("base_plus", *folds)})
    top_k = res["meta"]["top_k"]
    cols = ["base_plus", *folds, "exfold", "oracle_plus"]
    out = [header(res), "",
           "| M | experts | " + " | ".join(cols) + " | " +
           " | ".join(f"{p} vs base_plus" for p in folds) + " |",
           "|---:|---:|" + "---:|" * len(cols) + "---|" * len(folds)]
    for m in budgets:
        ref = by.get(("base_plus", m))
        cells = [_pct(by[(p, m)]["dppl_pct"]) if (p, m) in by else "-" for p in cols]
        diffs = [_diff_cell(by.get((p, m)), ref) for p in folds]
        label = f"{m}" + (" (< k)" if m < top_k else "")
        exp = _f(ref["experts"]) if ref else "-"
        out.append(f"| {label} | {exp} | " + " | ".join(cells) + " | " + " | ".join(diffs) + " |")
    return "\n".join(out)


MIN_REL_PCT = 0.05  # foldsum: smallest base_plus increase (%) whose relative change is reported


def _rel_cell(e) -> str:
    return "-" if e is None else f"{e[0]:+.1f} % at M={e[1]} ({_pct(e[2])} vs {_pct(e[3])} %)"


def foldsum(results: list[dict]) -> str:
    """One row per (file, base_fold setting): the budgets M where it is lower / not lower than
    base_plus (* = more than two standard errors) and its lowest and highest relative change of
    the increase (at budgets M >= k where base_plus's increase is at least MIN_REL_PCT %: below it the
    ratio of two near-zero increases says nothing))."""
    out = ["| model | B | setting | lower than base_plus (M) | not lower (M) | lowest change, M >= k | "
           "highest change, M >= k |", "|---|---:|---|---|---|---|---|"]
    for res in results:
        rows = res["rows"]
        by = {(r["policy"], r["value"]): r for r in rows}
        k = res["meta"]["top_k"]
        folds = list(dict.fromkeys(r["policy"] for r in rows if r["policy"].startswith("base_fold")))
        for p in folds:
            lower, higher, rel = [], [], []
            for r in sorted((r for r in rows if r["policy"] == p), key=lambda r: r["value"]):
                ref = by.get(("base_plus", r["value"]))
                if ref is None:
                    continue
                d = r["dnll"] - ref["dnll"]
                sig = abs(d) > 2 * math.sqrt(r["dnll_se"] ** 2 + ref["dnll_se"] ** 2)
                tag = f"{r['value']}" + ("*" if sig else "")
                (lower if r["dppl_pct"] < ref["dppl_pct"] else higher).append(tag)
                if r["value"] >= k and ref["dppl_pct"] >= MIN_REL_PCT:
                    rel.append((100 * (r["dppl_pct"] / ref["dppl_pct"] - 1), r["value"],
                                r["dppl_pct"], ref["dppl_pct"]))
            gain, loss = min(rel, default=None), max(rel, default=None)
            s = res["meta"]["settings"]
            out.append(f"| {res['meta']['model']} | {s['batch_size']} | {p} | "
                       f"{', '.join(lower) or 'none'} | {', '.join(higher) or 'none'} | "
                       f"{_rel_cell(gain)} | {_rel_cell(loss)} |")
    return "\n".join(out) + "\n\n(* = difference larger than two standard errors)"


def study(res: dict) -> str:
    """Held-out R^2 / Spearman / retained energy per layer and option, and each option's cost."""
    layers = res["layers"]
    opts = list(next(iter(layers.values())).keys())
    budgets = res["meta"]["budgets"]
    mid = budgets[len(budgets) // 2 - 1] if len(budgets) > 1 else budgets[0]
    out = [f"{res['meta']['model']}: {res['meta']['fit_windows']} fit / {res['meta']['heldout_windows']} "
           f"held-out windows, energy at B = {res['meta']['batch_size']}, M = {mid}; "
           f"{res['meta']['seconds']:.0f} s, commit `{res['meta']['commit']}`, transformers "
           f"{res['meta'].get('transformers', '?')}", "",
           "| option | R² held-out (mean; min-max over layers) | Spearman cost (mean; min) | "
           f"retained energy @M={mid} (mean; oracle) | MACs / token | predictor bytes / layer |",
           "|---|---|---|---|---:|---:|"]
    for o in opts:
        r2 = [layers[L][o]["r2"] for L in layers]
        rho = [layers[L][o]["spearman_cost"] for L in layers]
        en = [layers[L][o][f"energy_pred@{mid}"] for L in layers]
        orc = [layers[L][o][f"energy_oracle@{mid}"] for L in layers]
        cost = res["cost"].get(o, {})
        out.append(f"| {o} | {sum(r2) / len(r2):.3f}; {min(r2):.3f}-{max(r2):.3f} | "
                   f"{sum(rho) / len(rho):.3f}; {min(rho):.3f} | {sum(en) / len(en):.4f}; "
                   f"{sum(orc) / len(orc):.4f} | {cost.get('macs_per_token', '-')} | "
                   f"{cost.get('bytes_per_layer', '-')} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    per_file = {"quality": quality, "study": study, "variants": variants, "fold": fold}
    all_files = {"targets": targets, "errors": errors, "vtargets": vtargets, "foldsum": foldsum}
    if len(argv) < 2 or argv[0] not in (*per_file, *all_files):
        raise SystemExit("usage: python -m base_sglang.calibration.tables "
                         f"{'|'.join((*per_file, *all_files))} FILE.json...")
    results = [_load(p) for p in argv[1:]]
    if argv[0] in all_files:
        print(all_files[argv[0]](results))
        return
    for res in results:
        print(per_file[argv[0]](res))
        print()


if __name__ == "__main__":
    main()

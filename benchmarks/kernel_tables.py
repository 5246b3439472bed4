"""Markdown tables of BENCHMARKS.md's kernel section from a results folder.

    python benchmarks/kernel_tables.py select|align|moe|dense|route|fold|moe_e2e|hook DIR, or sweep FILE...
select: bench_base_select.py's base_select.json (selection latency per launch variant, share of the
        dense MoE layer); align: bench_fused_moe.py's fused_moe.json rows with SGLang's align timed;
moe:    fused_moe.json as one grid per shape (T x budget: ours µs (x byte floor) / SGLang µs [read]);
dense:  fused_moe.json's dense rows against SGLang (its align inside where it was timed);
route:  base_select.json's folded-router columns (what BASE adds to the router's GEMM + top-k);
fold:   DIR/e2e_fold and DIR/e2e_nofold summary.json of gpu/run_fold_e2e_h200.sh side by side;
moe_e2e: DIR/e2e_ours and DIR/e2e_sglang of gpu/run_moe_e2e_h200.sh (BASE_MOE=auto / sglang);
hook:   DIR/moe_hook.json of gpu/check_moe_hook.py (the plugin's MoE hook on the GPU);
sweep:  gpu/sweep_moe.py's sweep_moe.json files (FILE...): launch structures and the tile search;
read_floor: DIR/read_floor.json of gpu/read_floor.py: per (shape, T, M, bytes, pattern) the fastest read-only
        launch and the fastest at 2 programs per SM (the one-launch MoE's grid), x the byte floor;
trace_grid: gpu/trace_moe_one.py folders (DIR...): one row per (shape, T, M), one column per folder
        and variant (graph µs and x byte floor); trace_experts: its raw traces (Qwen3 T = 16), when
        each expert's last up and last down unit end;
profile: DIR/e2e_A and DIR/e2e_B profile_b16.json of bench_decode.py (A, B = split, fold or new,
        old): one profiled decode step's GPU time per kernel, GPU busy and idle time;
table_e2e: DIR/e2e_new and DIR/e2e_old summary.json (this commit's tuned table against the table
        without trace variants); aa_e2e: DIR/e2e_run1 and DIR/e2e_run2, two runs of one setting;
runs_e2e: every DIR/e2e_* of gpu/run_table_e2e_h200.sh (new / old table, repeated) side by side;
ab:     DIR/ab_{old,new}_R/fused_moe.json of run_moe_h200.sh's grouptune part: the dense layer with
        the shipped table and the new one, round by round, SGLang (its CUDA align inside) in every
        run; also writes DIR/ab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys


def select_table(rows: list[dict]) -> str:
    """One row per (shape, T); "by the rule" = the kernel base_select_experts picks for that shape
    now (kernels.select_experts.selection_kernel), with that kernel's measured time and share."""
    from base_sglang.kernels.select_experts import FUSED_MAX_T, FUSED_MIN_E

    experts = {"qwen3-30b-a3b": 128, "olmoe-1b-7b": 64, "mixtral-8x7b": 8}
    out = ["| shape | T | empty launch µs | two launches µs | fused µs | fused, plain launch µs | "
           "torch core µs | dense MoE µs | by the rule | its µs | its share |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        fused = r["T"] <= FUSED_MAX_T and experts[r["shape"]] >= FUSED_MIN_E
        us = r["fused_us"] if fused else r["two_us"]
        out.append(f"| {r['shape']} | {r['T']} | {r['empty_us']:.1f} | {r['two_us']:.1f} | "
                   f"{r['fused_us']:.1f} | {r['fused_nocoop_us']:.1f} | {r['torch_us']:.0f} | "
                   f"{r['dense_moe_us']:.1f} | {'fused' if fused else 'two'} | {us:.1f} | "
                   f"{us / r['dense_moe_us']:.1%} |")
    return "\n".join(out)


def align_table(rows: list[dict]) -> str:
    out = ["| shape | T | M | experts read | ours µs | SGLang µs (align outside) | "
           "SGLang µs (its align inside) | ours / SGLang with align |",
           "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "sglang_align_us" not in r:
            continue
        out.append(f"| {r['shape']} | {r['T']} | {r['M']} | {r['experts_read']} | "
                   f"{r['ours_us']:.1f} | {r['sglang_us']:.1f} | {r['sglang_align_us']:.1f} | "
                   f"{r['ours_over_sglang_align']:.2f} |")
    return "\n".join(out)


def moe_tables(rows: list[dict]) -> str:
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        rs = [r for r in rows if r["shape"] == shape]
        budgets = list(dict.fromkeys(str(r["M"]) for r in rs))
        cols = [f"M={m}" if m != "dense" else "dense" for m in budgets]
        out += [f"**{shape}**: ours µs (x byte floor) / SGLang µs (align outside) [experts read]", "",
                "| T | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for T in dict.fromkeys(r["T"] for r in rs):
            cell = {str(r["M"]): r for r in rs if r["T"] == T}
            out.append(f"| {T} | " + " | ".join(
                f"{c['ours_us']:.1f} ({c['ours_over_floor']:.2f}) / {c.get('sglang_us', float('nan')):.1f}"
                f" [{c['experts_read']}]" if (c := cell.get(m)) else "" for m in budgets) + " |")
        out.append("")
    return "\n".join(out).rstrip()


def dense_table(rows: list[dict]) -> str:
    out = ["| shape | T | experts read | ours µs | SGLang µs | SGLang's align | ours / SGLang |",
           "|---|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        if r["M"] != "dense" or "sglang_us" not in r:
            continue
        if "sglang_cuda_align_us" in r:
            sgl, where = r["sglang_cuda_align_us"], "inside (CUDA, sgl_kernel)"
        elif "sglang_align_us" in r:
            sgl, where = r["sglang_align_us"], "inside"
        else:
            sgl, where = r["sglang_us"], "outside (CUDA JIT)"
        out.append(f"| {r['shape']} | {r['T']} | {r['experts_read']} | {r['ours_us']:.1f} | "
                   f"{sgl:.1f} | {where} | {r['ours_us'] / sgl:.2f} |")
    return "\n".join(out)


def _sglang_us(r: dict) -> float:
    return r.get("sglang_cuda_align_us", r.get("sglang_align_us", r.get("sglang_us", float("nan"))))


def ab_table(folder: str) -> str:
    """Shipped (old) against new table, dense rows, per round; SGLang from every run of the round.

    Folders with only `ab_old_R` rounds (the densegrid part) get the old / SGLang columns only."""
    import statistics

    runs: dict[tuple, dict] = {}  # (shape, T) -> {(variant, round): row}
    rounds, variants = set(), set()
    for name in sorted(os.listdir(folder)):
        m = re.fullmatch(r"ab_(old|new)_(\d+)", name)
        path = os.path.join(folder, name, "fused_moe.json")
        if not m or not os.path.isfile(path):
            continue
        rounds.add(int(m.group(2)))
        variants.add(m.group(1))
        for r in json.load(open(path))["rows"]:
            if r["M"] == "dense":
                runs.setdefault((r["shape"], r["T"]), {})[(m.group(1), int(m.group(2)))] = r
    rs, vs = sorted(rounds), [v for v in ("old", "new") if v in variants]
    head = " / ".join(vs + ["SGLang"])
    ratios = (["new / old", "new / SGLang", "old / SGLang"] if len(vs) == 2 else [f"{v} / SGLang" for v in vs])
    out = ["| shape | T | experts read | " + " | ".join(f"r{k}: {head} µs" for k in rs)
           + "".join(f" | median {v}" for v in vs) + " | median SGLang | " + " | ".join(ratios) + " |",
           "|---|---:|---:|" + "---|" * len(rs) + "---:|" * (len(vs) + 1 + len(ratios))]
    summary = []
    for (shape, T), by in sorted(runs.items()):
        cells, us, sgl = [], {v: [] for v in vs}, []
        for k in rs:
            got = {v: by.get((v, k)) for v in vs}
            cells.append(" / ".join(f"{x['ours_us']:.1f}" if x else "-" for x in got.values())
                         + " / " + " ".join(f"{_sglang_us(x):.1f}" for x in got.values() if x))
            for v, x in got.items():
                us[v] += [x["ours_us"]] if x else []
            sgl += [_sglang_us(x) for x in got.values() if x]
        med = {v: statistics.median(x) if x else float("nan") for v, x in us.items()}
        ms = statistics.median(sgl) if sgl else float("nan")
        vals = ([med["new"] / med["old"], med["new"] / ms, med["old"] / ms] if len(vs) == 2
                else [med[v] / ms for v in vs])
        read = next(iter(by.values()))["experts_read"]
        out.append(f"| {shape} | {T} | {read} | " + " | ".join(cells)
                   + "".join(f" | {med[v]:.1f}" for v in vs) + f" | {ms:.1f} | "
                   + " | ".join(f"{x:.3f}" for x in vals) + " |")
        summary.append(dict(shape=shape, T=T, experts_read=read, **{f"{v}_us": us[v] for v in vs}, sglang_us=sgl,
                            **{f"median_{v}": med[v] for v in vs}, median_sglang=ms))
    with open(os.path.join(folder, "ab.json"), "w") as f:
        json.dump({"cells": summary}, f, indent=1)
    return "\n".join(out)


def route_table(rows: list[dict], gpu: str | None = None) -> str:
    """Per (shape, T): the routing sequences as CUDA graphs, and what BASE adds to the dense
    routing with the folded launch, its two-launch form (split) and the unfolded selection;
    "by the rule" = route_mode on the GPU the rows were measured on (the file's "gpu")."""
    from base_sglang.kernels.select_experts import route_mode

    experts = {"qwen3-30b-a3b": 128, "olmoe-1b-7b": 64, "mixtral-8x7b": 8}
    out = ["| shape | T | GEMM E µs | GEMM 2E µs | dense routing µs | folded + BASE µs | "
           "two launches µs | dense routing + unfolded BASE µs | torch top-k µs | dense MoE µs | "
           "folded adds | two launches add | unfolded adds | by the rule | its share |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        if "folded_us" not in r:
            continue
        mode = route_mode(r["T"], experts[r["shape"]], gpu)
        adds = {"fold": r["folded_us"] - r["router_us"], "unfold": r["unfolded_us"] - r["router_us"]}
        if "split_us" in r:
            adds["split"] = r["split_us"] - r["router_us"]
        split = f"{r['split_us']:.1f}" if "split_us" in r else "-"
        split_add = f"{adds['split']:.1f}" if "split" in adds else "-"
        its = adds.get(mode)
        share = f"{its / r['dense_moe_us']:.1%}" if its is not None else "-"
        name = {"fold": "folded", "split": "two launches", "unfold": "unfolded"}[mode]
        out.append(f"| {r['shape']} | {r['T']} | {r['gemm_us']:.1f} | {r['gemm2_us']:.1f} | "
                   f"{r['router_us']:.1f} | {r['folded_us']:.1f} | {split} | {r['unfolded_us']:.1f} | "
                   f"{r['torch_topk_us']:.1f} | {r['dense_moe_us']:.1f} | {adds['fold']:.1f} | "
                   f"{split_add} | {adds['unfold']:.1f} | {name} | {share} |")
    return "\n".join(out)


def fold_table(folder: str, a: str = "e2e_fold", b: str = "e2e_nofold",
               labels: tuple[str, str] = ("folded", "unfolded")) -> str:
    """Decode step (median ms) per (B, budget) of two runs: BASE_FOLD=auto and off (or a, b)."""
    runs = {}
    for name in (a, b):
        with open(os.path.join(folder, name, "summary.json")) as f:
            runs[name] = {(r["batch"], str(r["budget"])): r for r in json.load(f)["row_stats"]}
    out = [f"| B | budget | {labels[0]} ms/step | {labels[1]} ms/step | {labels[1]} / {labels[0]} |",
           "|---:|---|---:|---:|---:|"]
    for key in sorted(set(runs[a]) | set(runs[b]), key=lambda k: (k[0], k[1])):
        f, u = runs[a].get(key), runs[b].get(key)
        fm = f"{f['median_step_ms']:.2f}" if f else "not run (time budget)"
        um = f"{u['median_step_ms']:.2f}" if u else "not run (time budget)"
        ratio = f"{u['median_step_ms'] / f['median_step_ms']:.3f}" if f and u else "-"
        out.append(f"| {key[0]} | {key[1]} | {fm} | {um} | {ratio} |")
    return "\n".join(out)


BENCH_ROW = re.compile(r"^\s*(\d+)\s+(\S+)\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s*$")  # bench_decode's table


def _run_order(name: str) -> tuple[int, str]:
    """e2e_new, e2e_old (repeat 1), e2e_new_2, e2e_old_2 (log), ...: by repeat, then by name."""
    tail = name.split()[0].rsplit("_", 1)[1]
    return (int(tail) if tail.isdigit() else 1, name)


def runs_table(folder: str) -> str:
    """Decode step (median ms) per (B, budget) of every DIR/e2e_* run, in run order (run_table_e2e_h200.sh:
    e2e_new, e2e_old, e2e_new_2, ...), and the mean of the "old" runs over the mean of the "new" ones.
    A run without summary.json is read from the table its DIR/e2e_*.log printed (marked "(log)")."""
    runs = {}
    for name in os.listdir(folder):
        path = os.path.join(folder, name, "summary.json")
        if name.startswith("e2e_") and os.path.isfile(path):
            with open(path) as f:
                runs[name] = {(r["batch"], str(r["budget"])): r["median_step_ms"]
                              for r in json.load(f)["row_stats"]}
    for name in os.listdir(folder):  # a run whose summary.json did not come back: its log's table
        run = name[:-4]
        if name.startswith("e2e_") and name.endswith(".log") and run not in runs:
            with open(os.path.join(folder, name)) as f:
                rows = [m.groups() for m in map(BENCH_ROW.match, f) if m]
            if rows:
                runs[run + " (log)"] = {(int(b), budget): float(ms) for b, budget, ms in rows}
    names = sorted(runs, key=_run_order)
    keys = sorted({k for r in runs.values() for k in r}, key=lambda k: (k[0], k[1]))
    out = ["| B | budget | " + " | ".join(f"{n[4:]} ms/step" for n in names) + " | old / new (means) |",
           "|---:|---|" + "---:|" * (len(names) + 1)]
    for key in keys:
        vals = [runs[n].get(key) for n in names]
        new = [v for n, v in zip(names, vals) if v and n.startswith("e2e_new")]
        old = [v for n, v in zip(names, vals) if v and n.startswith("e2e_old")]
        ratio = f"{(sum(old) / len(old)) / (sum(new) / len(new)):.3f}" if new and old else "-"
        out.append(f"| {key[0]} | {key[1]} | " + " | ".join(f"{v:.2f}" if v else "not run" for v in vals)
                   + f" | {ratio} |")
    return "\n".join(out)


def trace_table(folder: str) -> str:
    """gpu/trace_moe_one.py cells: graph time, x byte floor, and the in-kernel timeline (us from
    the first program's start) of the variants it traced."""
    with open(os.path.join(folder, "trace_moe_one.json")) as f:
        cells = json.load(f)["cells"]
    out = ["| shape | T | M | variant | experts read | floor µs | graph µs | x floor | align done | "
           "last up unit ends | last down unit starts | span | mean up unit | mean down unit |",
           "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in cells:
        name = c.get("variant", f"prefetch {c.get('prefetch')}")
        if "us" not in c:
            out.append(f"| {c['shape']} | {c['T']} | {c['M']} | {name} | {c['experts_read']} | "
                       f"{c['floor_us']:.1f} | not run: {c.get('error', '?').splitlines()[0][:50]} | - | - | - | - | - | - | - |")
            continue
        g = c.get("trace")
        tl = ([f"{g[k]:.1f}" for k in ("align_done_us", "up_last_end_us", "down_last_go_us", "span_us",
                                       "up_mean_us", "down_compute_mean_us")] if g else ["-"] * 6)
        out.append(f"| {c['shape']} | {c['T']} | {c['M']} | {name} | {c['experts_read']} | "
                   f"{c['floor_us']:.1f} | {c['us']:.1f} | {c['x_floor']:.2f} | " + " | ".join(tl) + " |")
    return "\n".join(out)


def read_floor_table(folder: str) -> str:
    """gpu/read_floor.py's cells: per (shape, T, M, mode, pattern) the best launch over every grid /
    chunk / stages / warps, and the best with 2 programs per SM (as moe_one runs at Qwen3 T = 16)."""
    with open(os.path.join(folder, "read_floor.json")) as f:
        doc = json.load(f)
    # the run's SM count (files written before it was recorded ran grids 1..4 x SMs)
    sms = doc.get("sms") or min(c["programs"] for c in doc["cells"])
    groups: dict[tuple, list[dict]] = {}
    for c in doc["cells"]:
        if c.get("sum_ok", True):
            groups.setdefault((c["shape"], c["T"], c["M"], c["mode"], c.get("pattern", "flat")),
                              []).append(c)
    out = [f"{doc.get('gpu', '?')}, copy rate {doc['copy_bw_gbs']:.0f} GB/s",
           "", "| shape | T | M | bytes | MB | floor µs | fastest µs (x floor) | its grid, chunk, stages, warps "
           f"| at {2 * sms} programs µs (x floor) |", "|---|---:|---:|---|---:|---:|---|---|---|"]
    for (shape, T, M, mode, pattern), cells in groups.items():
        best = min(cells, key=lambda c: c["us"])
        two = [c for c in cells if c["programs"] == 2 * sms]
        b2 = min(two, key=lambda c: c["us"]) if two else None
        what = ("gate_up + down" if mode == "all" else "gate_up") + (
            ", moe_one's tiles" if pattern == "tiles" else "")
        out.append(f"| {shape} | {T} | {M} | {what} | {best['bytes'] / 1e6:.1f} | {best['floor_us']:.1f} | "
                   f"{best['us']:.1f} ({best['x_floor']:.2f}) | {best['programs']}, {best['chunk']}, "
                   f"{best['stages']}, {best['warps']} | "
                   + (f"{b2['us']:.1f} ({b2['x_floor']:.2f}) |" if b2 else "- |"))
    return "\n".join(out)


def trace_grid(folders: list[str]) -> str:
    """trace_moe_one.json of several folders as one grid: µs (x floor) per folder and variant."""
    cols, grid, floors = [], {}, {}
    for folder in folders:
        with open(os.path.join(folder, "trace_moe_one.json")) as f:
            cells = json.load(f)["cells"]
        tag = os.path.basename(os.path.dirname(os.path.abspath(folder))) or folder
        for c in cells:
            col = f"{tag}: {c['variant']}"
            if col not in cols:
                cols.append(col)
            key = (c["shape"], c["T"], c["M"])
            floors[key] = c["floor_us"]
            grid.setdefault(key, {})[col] = (f"{c['us']:.1f} ({c['x_floor']:.2f})" if "us" in c
                                             else "not run")
    out = ["| shape | T | M | floor µs | " + " | ".join(cols) + " |",
           "|---|---:|---:|---:|" + "---:|" * len(cols)]
    for key in sorted(grid):
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {floors[key]:.1f} | "
                   + " | ".join(grid[key].get(c, "-") for c in cols) + " |")
    return "\n".join(out)


def expert_phases(raw: dict) -> dict:
    """One raw trace (trace_moe_one.json raw_traces): per expert j, when its last up unit and its
    last down unit end (us from the first program's start), and how many SMs ran two up units."""
    rows, u1, ran = raw["rows"], raw["up_units"], raw["ran"]
    n = raw["M"] if raw.get("M") else 1
    prog = [r for r in rows[raw["units"]:] if r[0] > 0]
    t0 = min(r[0] for r in prog)
    n_act = n if u1 % n == 0 and (ran - u1) % n == 0 else None
    if n_act is None:
        return {}
    nt1, nt2 = u1 // n_act, (ran - u1) // n_act
    up = [max(rows[j * nt1 + k][2] for k in range(nt1)) for j in range(n_act)]
    dn = [max(rows[u1 + j * nt2 + k][2] for k in range(nt2)) for j in range(n_act)]
    sms: dict[int, int] = {}
    for r in rows[:u1]:
        sms[r[3]] = sms.get(r[3], 0) + 1
    return dict(up_end=[round((v - t0) / 1e3, 1) for v in up], down_end=[round((v - t0) / 1e3, 1) for v in dn],
                span=round((max(r[2] for r in prog) - t0) / 1e3, 1),
                sms_with_2_up=sum(1 for v in sms.values() if v >= 2))


def trace_experts(folder: str) -> str:
    """The raw traces of trace_moe_one.json (Qwen3 T = 16 cells): each expert's up and down ends."""
    with open(os.path.join(folder, "trace_moe_one.json")) as f:
        d = json.load(f)
    out = ["| T | M | variant | SMs with 2 up units | last up unit of expert j ends (j = 0, 1, ...) | "
           "last down unit of expert j ends | span |", "|---:|---:|---|---:|---|---|---:|"]
    for raw in d.get("raw_traces") or ([d["raw_trace"]] if d.get("raw_trace") else []):
        g = expert_phases(raw)
        if not g:
            continue
        out.append(f"| {raw['T']} | {raw['M']} | {raw.get('variant', 'shipped')} | {g['sms_with_2_up']} | "
                   + " ".join(f"{v:.1f}" for v in g["up_end"]) + " | "
                   + " ".join(f"{v:.1f}" for v in g["down_end"]) + f" | {g['span']:.1f} |")
    return "\n".join(out)


def profile_table(folder: str, a: str, b: str, min_ms: float = 0.05) -> str:
    """The profiled graph steps (bench_decode.py profile_b16.json, one per profiled budget, at
    --profile-batch) of two runs: per budget both runs have, per kernel ms per step and µs per launch
    (kernels with >= min_ms in either), GPU busy, step - busy (idle). A run that never reached its
    profiled batch (no profile_b16.json) is named instead."""
    paths = {name: os.path.join(folder, f"e2e_{name}", "profile_b16.json") for name in (a, b)}
    missing = [f"e2e_{name}" for name, path in paths.items() if not os.path.isfile(path)]
    if missing:
        return f"(not profiled: {', '.join(missing)} has no profile_b16.json)"
    profs = {}
    for name in (a, b):
        with open(paths[name]) as f:
            profs[name] = {k: v for k, v in json.load(f).items()
                           if not k.startswith("_") and "error" not in v}
    keys = [k for k in profs[a] if k in profs[b]]
    if not keys:
        return f"no profiled step that both e2e_{a} and e2e_{b} have"
    return "\n\n".join(_profile_pair({n: profs[n][k] for n in (a, b)}, a, b, min_ms) for k in keys)


def _profile_pair(runs: dict, a: str, b: str, min_ms: float) -> str:
    kern = {n: {k["name"]: k for k in r["graph_kernels"]["top_kernels"]} for n, r in runs.items()}
    names = [k for k in dict.fromkeys(list(kern[a]) + list(kern[b]))
             if max(kern[n].get(k, {}).get("ms_per_step", 0) for n in (a, b)) >= min_ms]
    r0 = runs[a]
    out = [f"B = {r0['batch']}, budget {r0['budget']}, {r0['routing']} routing", "",
           f"| | {a} ms/step | {a} µs/launch | {b} ms/step | {b} µs/launch |", "|---|---:|---:|---:|---:|"]

    def cells(n, k):
        e = kern[n].get(k)
        if not e:
            return "-", "-"
        return f"{e['ms_per_step']:.3f}", f"{e['ms_per_step'] * 1e3 / max(e['launches_per_step'], 1):.1f}"

    for k in names:
        short = k if len(k) <= 60 else k[:57] + "..."
        out.append(f"| `{short}` | " + " | ".join(x for n in (a, b) for x in cells(n, k)) + " |")
    for label, f in (("graph step", lambda r: r["graph_step_ms"]),
                     ("GPU busy", lambda r: r["graph_kernels"]["gpu_busy_ms_per_step"]),
                     ("step - busy", lambda r: r["graph_step_ms"] - r["graph_kernels"]["gpu_busy_ms_per_step"])):
        out.append(f"| **{label}** | " + " | ".join(f"{f(runs[n]):.3f} | -" for n in (a, b)) + " |")
    return "\n".join(out)


def hook_table(folder: str) -> str:
    """One row per (shape, T) of check_moe_hook.py: which kernel ran, errors, bitwise checks."""
    with open(os.path.join(folder, "moe_hook.json")) as f:
        rows = json.load(f)["rows"]
    out = ["| shape | T | dropped slots | kernel that ran (expected) | rel. err. vs fp32 | "
           "SGLang's rel. err. | rerun bitwise | inplace | graph replays == eager |",
           "|---|---:|---:|---|---:|---|---|---|---|"]
    for r in rows:
        if "rel_ref" not in r:
            out.append(f"| {r['shape']} | {r['T']} | - | not run: {r.get('error', '?')} | - | - | - | - | - |")
            continue
        sgl = (f"{r['rel_sglang_ref']:.1e}" if "sglang_error" not in r
               else f"not run: {r['sglang_error'][:60]}")
        out.append(f"| {r['shape']} | {r['T']} | {r['dropped']} | {r['ran']} ({r['expected']}) | "
                   f"{r['rel_ref']:.1e} | {sgl} | {r['bitwise_rerun']} | {r['inplace']} | "
                   f"{r.get('graph_replays_equal', '-')} |")
    return "\n".join(out)


def sweep_table(paths: list[str]) -> str:
    """gpu/sweep_moe.py cells: each launch structure's µs, the tile search's best, x byte floor."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))
    from sweep_moe import short

    out = ["| shape | T | routing | experts read | floor µs | grouped | pair-major | one launch | "
           "one, 2 per SM | tile search on | its best µs | x floor | its config |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for path in paths:
        with open(path) as f:
            cells = json.load(f)["cells"]
        for c in cells:
            st = c["structures"]
            cols = [f"{st[k]:.1f}" if k in st and st[k] != float("inf") else "-"
                    for k in ("grouped", "pair", "one", "one2")]
            tuned = (f"{c.get('searched', c['best_structure'])} | {c['tuned_us']:.1f} | "
                     f"{c['tuned_us'] / c['floor_us']:.2f} | {short(c['tuned'])}"
                     if "tuned" in c else "- | - | - | -")
            out.append(f"| {c['shape']} | {c['T']} | {c['routing']} | {c['experts_read']} | "
                       f"{c['floor_us']:.1f} | " + " | ".join(cols) + f" | {tuned} |")
    return "\n".join(out)


def split_table(paths: list[str]) -> str:
    """gpu/sweep_split.py cells: router, one launch, unfolded, two launches (default tiling and each
    variant of BASE_ROUTE_SPLIT_TILES = rows per program, warps 1, warps 2[, iter, narrow width])."""
    cells = []
    for path in paths:
        with open(path) as f:
            cells += json.load(f)["rows"]
    names = list(dict.fromkeys(v for c in cells for v in c["variants"]))
    out = ["| shape | T | dense routing µs | one launch µs | unfolded µs | two launches µs (default "
           "tiling) | " + " | ".join(names) + " |",
           "|---|---:|---:|---:|---:|---|" + "---:|" * len(names)]
    for c in cells:
        vs = [c["variants"].get(n) for n in names]
        cols = [f"{v:.1f}" if isinstance(v, float) else ("error" if v else "-") for v in vs]
        out.append(f"| {c['shape']} | {c['T']} | {c['router_us']:.1f} | {c['fold_us']:.1f} | "
                   f"{c['unfold_us']:.1f} | {c['split_us']:.1f} ({c['split_default']}) | "
                   + " | ".join(cols) + " |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("select", "align", "moe", "dense", "route", "fold", "moe_e2e",
                                     "hook", "sweep", "split", "split_e2e", "split_fold_e2e",
                                     "trace", "trace_grid", "trace_experts", "profile", "table_e2e",
                                     "aa_e2e", "runs_e2e", "ab", "read_floor"))
    ap.add_argument("folder", help="a results folder with base_select.json / fused_moe.json "
                    "(sweep: sweep_moe.json files; split: sweep_split.json files)", nargs="+")
    args = ap.parse_args()
    kind = args.kind
    if kind in ("sweep", "split"):
        print((sweep_table if kind == "sweep" else split_table)(args.folder))
        return 0
    if kind == "trace_grid":
        print(trace_grid(args.folder))
        return 0
    args.folder = args.folder[0]
    if kind == "fold":
        print(fold_table(args.folder))
        return 0
    if kind == "hook":
        print(hook_table(args.folder))
        return 0
    if kind == "split_e2e":  # BASE_ROUTE=split (the default at 32-128 rows) against unfold
        print(fold_table(args.folder, "e2e_split", "e2e_unfold", ("two launches", "unfolded")))
        return 0
    if kind == "split_fold_e2e":  # BASE_ROUTE=split against fold (the default below route_split_min_t)
        print(fold_table(args.folder, "e2e_split", "e2e_fold", ("two launches", "one launch")))
        return 0
    if kind == "read_floor":  # gpu/read_floor.py
        print(read_floor_table(args.folder))
        return 0
    if kind == "trace":  # gpu/trace_moe_one.py
        print(trace_table(args.folder))
        return 0
    if kind == "trace_experts":  # its raw traces: when each expert's up and down units end
        print(trace_experts(args.folder))
        return 0
    if kind == "profile":  # two e2e runs' profiled step: split / fold, else new / old (and repeats)
        pair = next((p for p in (("split", "fold"), ("run1", "run2"))
                     if os.path.isdir(os.path.join(args.folder, f"e2e_{p[0]}"))), ("new", "old"))
        print(profile_table(args.folder, *pair))
        for n in range(2, 10):  # e2e_new_N / e2e_old_N, the repeats run_table_e2e_h200.sh names
            if all(os.path.isdir(os.path.join(args.folder, f"e2e_{r}_{n}")) for r in pair):
                print(f"\nrepeat {n}\n\n" + profile_table(args.folder, *(f"{r}_{n}" for r in pair)))
        return 0
    if kind == "table_e2e":  # this commit's tuned table against the one without trace variants
        print(fold_table(args.folder, "e2e_new", "e2e_old", ("tuned table", "without trace variants")))
        return 0
    if kind == "runs_e2e":  # gpu/run_table_e2e_h200.sh: new / old tables, repeated
        print(runs_table(args.folder))
        return 0
    if kind == "ab":  # run_moe_h200.sh grouptune: shipped / new table, dense rows, rounds
        print(ab_table(args.folder))
        return 0
    if kind == "aa_e2e":  # the same setting twice, one after the other
        print(fold_table(args.folder, "e2e_run1", "e2e_run2", ("first run", "second run")))
        return 0
    if kind == "moe_e2e":  # run_moe_e2e_h200.sh: BASE_MOE=auto (ours) against sglang
        print(fold_table(args.folder, "e2e_ours", "e2e_sglang", ("our MoE", "SGLang's MoE")))
        return 0
    path = os.path.join(args.folder, "base_select.json" if kind in ("select", "route")
                        else "fused_moe.json")
    if not os.path.isfile(path):
        ap.error(f"folder: no {os.path.basename(path)} in {args.folder}")
    with open(path) as f:
        doc = json.load(f)
    rows = doc["rows"]
    if kind == "route":
        print(route_table(rows, doc.get("gpu")))
        return 0
    tables = {"select": select_table, "align": align_table, "moe": moe_tables, "dense": dense_table}
    print(tables[kind](rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

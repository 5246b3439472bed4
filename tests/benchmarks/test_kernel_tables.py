"""benchmarks/kernel_tables.py: the kernel section's tables come from the result rows (the shipped
dispatch rule picks each row's kernel) and bad arguments get a CLI message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "kernel_tables.py"


def _row(shape, T, fused, two):
    return dict(shape=shape, T=T, empty_us=1.0, two_us=two, fused_us=fused, fused_nocoop_us=fused,
                torch_us=200.0, dense_moe_us=100.0)


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_select_table_follows_the_dispatch_rule(tmp_path):
    rows = [_row("qwen3-30b-a3b", 16, 9.0, 12.0), _row("qwen3-30b-a3b", 64, 21.0, 19.0),
            _row("olmoe-1b-7b", 16, 9.0, 8.0)]
    (tmp_path / "base_select.json").write_text(json.dumps({"rows": rows}))
    out = _run("select", str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stdout.splitlines() if x.startswith("| qwen3") or x.startswith("| olmoe")]
    assert lines[0].endswith("| fused | 9.0 | 9.0% |")  # E = 128, T = 16
    assert lines[1].endswith("| two | 19.0 | 19.0% |")  # T = 64 > FUSED_MAX_T
    assert lines[2].endswith("| two | 8.0 | 8.0% |")  # E = 64 < FUSED_MIN_E


def test_missing_file_is_a_cli_error(tmp_path):
    out = _run("align", str(tmp_path))
    assert out.returncode == 2 and "folder: no fused_moe.json" in out.stderr


def _moe_row(shape, T, M, ours, sgl, align=None):
    r = dict(shape=shape, T=T, M=M, experts_read=8, floor_us=20.0, ours_us=ours,
             ours_over_floor=ours / 20.0, sglang_us=sgl)
    if align is not None:
        r["sglang_align_us"] = align
    return r


def test_moe_and_dense_tables(tmp_path):
    rows = [_moe_row("qwen3-30b-a3b", 1, 8, 25.0, 28.0, 30.0),
            _moe_row("qwen3-30b-a3b", 1, "dense", 26.0, 28.5, 31.0),
            _moe_row("qwen3-30b-a3b", 32, "dense", 150.0, 147.0)]
    (tmp_path / "fused_moe.json").write_text(json.dumps({"rows": rows}))
    out = _run("moe", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "| 1 | 25.0 (1.25) / 28.0 [8] | 26.0 (1.30) / 28.5 [8] |" in out.stdout
    assert "| 32 |  | 150.0 (7.50) / 147.0 [8] |" in out.stdout  # no M=8 row at T=32
    dense = _run("dense", str(tmp_path)).stdout.splitlines()
    assert dense[2] == "| qwen3-30b-a3b | 1 | 8 | 26.0 | 31.0 | inside | 0.84 |"
    assert dense[3] == "| qwen3-30b-a3b | 32 | 8 | 150.0 | 147.0 | outside (CUDA JIT) | 1.02 |"


def test_hook_table(tmp_path):
    rows = [dict(shape="qwen3-30b-a3b", T=16, dropped=7, ran="ours", expected="ours", rel_ref=2.3e-3,
                 rel_sglang_ref=2.5e-3, bitwise_rerun=True, inplace=True, graph_replays_equal=True),
            dict(shape="olmoe-1b-7b", T=4, dropped=2, ran="ours", expected="ours", rel_ref=2.4e-3,
                 rel_sglang_ref=float("inf"), sglang_error="AssertionError: no TP group",
                 bitwise_rerun=True, inplace=False, graph_replays_equal=False),
            dict(shape="olmoe-1b-7b", T=17, ok=False, error="RuntimeError: boom")]
    (tmp_path / "moe_hook.json").write_text(json.dumps({"info": {}, "rows": rows}))
    out = _run("hook", str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stdout.splitlines() if x.startswith(("| qwen3", "| olmoe"))]
    assert lines[0] == "| qwen3-30b-a3b | 16 | 7 | ours (ours) | 2.3e-03 | 2.5e-03 | True | True | True |"
    assert "not run: AssertionError: no TP group | True | False | False |" in lines[1]
    assert lines[2].startswith("| olmoe-1b-7b | 17 | - | not run: RuntimeError: boom |")


def _route_row(shape, T, router, folded, split, unfolded, dense):
    return dict(shape=shape, T=T, gemm_us=5.0, gemm2_us=5.5, router_us=router, folded_us=folded,
                split_us=split, unfolded_us=unfolded, torch_topk_us=20.0, dense_moe_us=dense)


def test_route_table_takes_the_share_of_the_launch_the_rule_picks(tmp_path, monkeypatch):
    monkeypatch.delenv("BASE_ROUTE", raising=False)
    rows = [_route_row("qwen3-30b-a3b", 1, 6.0, 7.0, 8.0, 13.0, 25.0),  # < 32 rows: one launch
            _route_row("qwen3-30b-a3b", 64, 8.0, 25.0, 11.0, 26.0, 150.0),  # two launches
            _route_row("olmoe-1b-7b", 256, 8.0, 40.0, 12.0, 30.0, 200.0)]  # past SPLIT_MAX_T
    (tmp_path / "base_select.json").write_text(json.dumps({"rows": rows}))
    out = _run("route", str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stdout.splitlines() if x.startswith(("| qwen3", "| olmoe"))]
    assert lines[0].endswith("| 1.0 | 2.0 | 7.0 | folded | 4.0% |")
    assert lines[1].endswith("| 17.0 | 3.0 | 18.0 | two launches | 2.0% |")
    assert lines[2].endswith("| 32.0 | 4.0 | 22.0 | unfolded | 11.0% |")
    # measured on a GPU whose file moves the two launches down to 8 rows (route_split_min_t)
    rows = [_route_row("qwen3-30b-a3b", 1, 6.0, 7.0, 8.0, 13.0, 25.0),
            _route_row("qwen3-30b-a3b", 16, 7.7, 13.0, 10.7, 13.9, 147.2)]
    for gpu, rule in ((None, "| 5.3 | 3.0 | 6.2 | folded | 3.6% |"),
                      ("No Such GPU", "| 5.3 | 3.0 | 6.2 | folded | 3.6% |"),
                      ("NVIDIA H200", "| 5.3 | 3.0 | 6.2 | two launches | 2.0% |"),
                      ("NVIDIA H100 80GB HBM3", "| 5.3 | 3.0 | 6.2 | two launches | 2.0% |")):
        (tmp_path / "base_select.json").write_text(json.dumps({"gpu": gpu, "rows": rows}))
        out = _run("route", str(tmp_path))
        lines = [x for x in out.stdout.splitlines() if x.startswith("| qwen3")]
        assert lines[0].endswith("| folded | 4.0% |") and lines[1].endswith(rule), (gpu, lines)


def test_split_sweep_table(tmp_path):
    cell = dict(shape="qwen3-30b-a3b", T=16, router_us=8.0, fold_us=13.4, unfold_us=14.0,
                split_us=11.0, split_default="4,4,4", variants={"4,4,4,0,0": 10.9, "2,2,2": "error: x"})
    path = tmp_path / "sweep_split.json"
    path.write_text(json.dumps({"rows": [cell]}))
    out = _run("split", str(path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[2] == ("| qwen3-30b-a3b | 16 | 8.0 | 13.4 | 14.0 | 11.0 (4,4,4) | "
                                          "10.9 | error |")


def test_trace_table_and_the_split_against_fold_decode_table(tmp_path):
    timeline = dict(align_done_us=1.3, up_last_end_us=19.2, down_last_go_us=19.3, span_us=31.5,
                    up_mean_us=16.6, down_compute_mean_us=9.7)
    cells = [dict(shape="qwen3-30b-a3b", T=16, M=8, variant="shipped", experts_read=8, floor_us=17.8,
                  us=33.4, x_floor=1.876, trace=timeline),
             dict(shape="qwen3-30b-a3b", T=16, M=8, variant="up=32:128:4:4", experts_read=8,
                  floor_us=17.8, us=32.7, x_floor=1.837),
             dict(shape="olmoe-1b-7b", T=4, M=16, variant="shipped", experts_read=16, floor_us=47.0,
                  error="CompilationError: at 1:2")]
    (tmp_path / "trace_moe_one.json").write_text(json.dumps({"cells": cells}))
    out = _run("trace", str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()[2:]
    assert lines[0] == ("| qwen3-30b-a3b | 16 | 8 | shipped | 8 | 17.8 | 33.4 | 1.88 | 1.3 | 19.2 | "
                        "19.3 | 31.5 | 16.6 | 9.7 |")
    assert lines[1].endswith("| 32.7 | 1.84 | - | - | - | - | - | - |")
    assert "not run: CompilationError" in lines[2]
    for name, ms in (("e2e_split", {(16, "16"): 6.04}), ("e2e_fold", {(16, "16"): 5.82, (8, "16"): 5.5})):
        (tmp_path / name).mkdir()
        stats = [dict(batch=b, budget=int(g), median_step_ms=v) for (b, g), v in ms.items()]
        (tmp_path / name / "summary.json").write_text(json.dumps({"row_stats": stats}))
    out = _run("split_fold_e2e", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[2:] == ["| 8 | 16 | not run (time budget) | 5.50 | - |",
                                           "| 16 | 16 | 6.04 | 5.82 | 0.964 |"]


def test_trace_grid_and_profile_tables(tmp_path):
    for call, us in (("a", 40.0), ("b", 36.0)):
        d = tmp_path / call / "trace"
        d.mkdir(parents=True)
        cells = [dict(shape="qwen3-30b-a3b", T=16, M=16, variant="shipped", floor_us=36.0, us=us,
                      x_floor=us / 36.0),
                 dict(shape="qwen3-30b-a3b", T=16, M=16, variant="u=48", floor_us=36.0,
                      error="ValueError: up_cols")]
        (d / "trace_moe_one.json").write_text(json.dumps({"cells": cells}))
    out = _run("trace_grid", str(tmp_path / "a" / "trace"), str(tmp_path / "b" / "trace"))
    assert out.returncode == 0, out.stderr
    assert "| a: shipped | a: u=48 | b: shipped | b: u=48 |" in out.stdout
    assert "| qwen3-30b-a3b | 16 | 16 | 36.0 | 40.0 (1.11) | not run | 36.0 (1.00) | not run |" in out.stdout

    def prof(kernels, step, busy):
        top = [dict(name=n, ms_per_step=ms, launches_per_step=48.0) for n, ms in kernels]
        return {"uniform-random/16": dict(batch=16, budget=16, routing="uniform-random",
                                          graph_step_ms=step, graph_kernels=dict(
                                              gpu_busy_ms_per_step=busy, top_kernels=top)),
                "_run_info": {}}

    for name, kernels, step, busy in (("split", [("_moe_one_kernel", 2.4), ("_split_route_kernel", 0.13),
                                                 ("tiny", 0.01)], 5.9, 5.3),
                                      ("fold", [("_moe_one_kernel", 2.3), ("_base_route_kernel", 0.38)],
                                       5.7, 5.25)):
        (tmp_path / f"e2e_{name}").mkdir()
        (tmp_path / f"e2e_{name}" / "profile_b16.json").write_text(json.dumps(prof(kernels, step, busy)))
    out = _run("profile", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "| `_moe_one_kernel` | 2.400 | 50.0 | 2.300 | 47.9 |" in out.stdout
    assert "| `_split_route_kernel` | 0.130 | 2.7 | - | - |" in out.stdout
    assert "| `_base_route_kernel` | - | - | 0.380 | 7.9 |" in out.stdout
    assert "tiny" not in out.stdout  # below 0.05 ms per step in both
    assert "| **step - busy** | 0.600 | - | 0.450 | - |" in out.stdout


def test_aa_e2e_and_the_profile_of_two_runs(tmp_path):
    for name, ms, step in (("run1", 2.2, 5.96), ("run2", 2.2, 6.18)):
        d = tmp_path / f"e2e_{name}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"row_stats": [
            dict(batch=16, budget=16, median_step_ms=step)]}))
        (d / "profile_b16.json").write_text(json.dumps({"uniform-random/16": dict(
            batch=16, budget=16, routing="uniform-random", graph_step_ms=step, graph_kernels=dict(
                gpu_busy_ms_per_step=5.1, top_kernels=[dict(name="_moe_one_kernel", ms_per_step=ms,
                                                             launches_per_step=48.0)]))}))
    out = _run("aa_e2e", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "| 16 | 16 | 5.96 | 6.18 | 1.037 |" in out.stdout and "first run ms/step" in out.stdout
    out = _run("profile", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "| | run1 ms/step |" in out.stdout and "| **step - busy** | 0.860 | - | 1.080 | - |" in out.stdout


def test_runs_e2e_orders_the_repeats_and_averages_old_over_new(tmp_path):
    for name, rows in (("new", {8: 5.0, 16: 6.0}), ("old", {8: 5.5, 16: 6.2}),
                       ("new_2", {8: 5.2}), ("old_2", {8: 5.7, 16: 6.4})):
        d = tmp_path / f"e2e_{name}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"row_stats": [
            dict(batch=b, budget=16, median_step_ms=ms) for b, ms in rows.items()]}))
    (tmp_path / "e2e_broken").mkdir()  # no summary.json: not a run
    (tmp_path / "e2e_old_3.log").write_text(  # its summary.json did not come back: the log's table
        "[profile] B=8 budget=16: graph 6.0 ms/step\n B  budget   tok/s  ms/step  experts/layer  union\n"
        "--  ------  ------  -------  -------------  -----\n8      16  1325.0     5.9           16.0   52.5\n")
    (tmp_path / "e2e_new.log").write_text("8      16  1.0     9.99           16.0   52.5\n")  # has JSON
    out = _run("runs_e2e", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert ("| B | budget | new ms/step | old ms/step | new_2 ms/step | old_2 ms/step | old_3 (log) ms/step "
            "| old / new (means) |") in out.stdout
    assert "| 8 | 16 | 5.00 | 5.50 | 5.20 | 5.70 | 5.90 | 1.118 |" in out.stdout  # (5.5+5.7+5.9)/3 / 5.1
    assert "| 16 | 16 | 6.00 | 6.20 | not run | 6.40 | not run | 1.050 |" in out.stdout  # 6.3 / 6.0
    assert "broken" not in out.stdout and "9.99" not in out.stdout


def test_trace_experts_table(tmp_path):
    # 2 experts x (2 up + 2 down units), 4 programs (rows 8..11); ns stamps [start, mid, end, SM]:
    # expert 0's up units both ran on SM 5 and end last, so its down units end last
    units = [[1_000, 0, 9_000, 5], [1_000, 0, 9_500, 5], [1_000, 0, 7_000, 1], [1_000, 0, 7_200, 2],
             [1_000, 9_500, 14_000, 3], [1_000, 9_600, 14_500, 4], [1_000, 7_200, 12_000, 6],
             [1_000, 7_300, 12_100, 7]]
    progs = [[500, 900, 14_500, 5], [600, 900, 12_100, 1], [700, 900, 9_500, 2], [0, 0, 0, 0]]
    raw = dict(shape="qwen3-30b-a3b", T=16, M=2, variant="p=1", units=8, up_units=4, ran=8,
               rows=units + progs)
    (tmp_path / "trace_moe_one.json").write_text(json.dumps({"cells": [], "raw_traces": [raw]}))
    out = _run("trace_experts", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[2:] == ["| 16 | 2 | p=1 | 1 | 9.0 6.7 | 14.0 11.6 | 14.0 |"]


def test_ab_table_medians_over_rounds_and_sglang_of_every_run(tmp_path):
    def row(ours, cuda):
        r = _moe_row("qwen3-30b-a3b", 64, "dense", ours, cuda + 5.0)
        r["sglang_cuda_align_us"] = cuda
        return r

    times = {("old", 1): (168.0, 167.0), ("new", 1): (160.0, 166.0), ("old", 2): (170.0, 168.0),
             ("new", 2): (161.0, 169.0)}
    for (v, k), (ours, cuda) in times.items():
        d = tmp_path / f"ab_{v}_{k}"
        d.mkdir()
        rows = [row(ours, cuda), _moe_row("qwen3-30b-a3b", 64, 16, 70.0, 71.0)]  # a BASE row: ignored
        (d / "fused_moe.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "ab_new_x").mkdir()  # not a round: ignored
    out = _run("ab", str(tmp_path))
    assert out.returncode == 0, out.stderr
    line = [x for x in out.stdout.splitlines() if x.startswith("| qwen3")][0]
    # medians: old 169.0, new 160.5, SGLang 167.5 (of 167, 166, 168, 169)
    assert line == ("| qwen3-30b-a3b | 64 | 8 | 168.0 / 160.0 / 167.0 166.0 | 170.0 / 161.0 / 168.0 169.0 "
                    "| 169.0 | 160.5 | 167.5 | 0.950 | 0.958 | 1.009 |")
    cell = json.loads((tmp_path / "ab.json").read_text())["cells"][0]
    assert cell["old_us"] == [168.0, 170.0] and cell["sglang_us"] == [167.0, 166.0, 168.0, 169.0]


def test_ab_table_with_old_rounds_only_has_no_new_columns(tmp_path):
    for k, (ours, cuda) in {1: (27.0, 33.0), 2: (28.0, 34.0), 3: (26.0, 32.0)}.items():
        r = _moe_row("qwen3-30b-a3b", 1, "dense", ours, cuda + 5.0)
        r["sglang_cuda_align_us"] = cuda
        d = tmp_path / f"ab_old_{k}"
        d.mkdir()
        (d / "fused_moe.json").write_text(json.dumps({"rows": [r]}))
    out = _run("ab", str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "new" not in lines[0] and lines[0].endswith("| median old | median SGLang | old / SGLang |")
    assert lines[2] == "| qwen3-30b-a3b | 1 | 8 | 27.0 / 33.0 | 28.0 / 34.0 | 26.0 / 32.0 | 27.0 | 33.0 | 0.818 |"
    cell = json.loads((tmp_path / "ab.json").read_text())["cells"][0]
    assert "median_new" not in cell and cell["median_old"] == 27.0 and cell["median_sglang"] == 33.0


def test_profile_table_has_one_table_per_budget_both_runs_profiled(tmp_path):
    def step(budget, moe_ms, step_ms):
        return dict(batch=64, budget=budget, routing="uniform-random", graph_step_ms=step_ms,
                    graph_kernels=dict(gpu_busy_ms_per_step=step_ms - 1.0, top_kernels=[
                        dict(name="_moe_align_sort_kernel", ms_per_step=moe_ms, launches_per_step=48.0)]))

    for name, prof in (("new", {"uniform-random/16": step(16, 0.2, 8.0),
                                "uniform-random/dense": step("dense", 0.3, 20.0)}),
                       ("old", {"uniform-random/16": step(16, 0.6, 8.5),
                                "uniform-random/dense": {"batch": 64, "budget": "dense",
                                                         "error": "RuntimeError: x"}})):
        (tmp_path / f"e2e_{name}").mkdir()
        (tmp_path / f"e2e_{name}" / "profile_b16.json").write_text(json.dumps(prof))
    out = _run("profile", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("B = 64, budget") == 1  # dense failed in old: no pair to compare
    assert "| `_moe_align_sort_kernel` | 0.200 | 4.2 | 0.600 | 12.5 |" in out.stdout
    assert "| **graph step** | 8.000 | - | 8.500 | - |" in out.stdout


def test_profile_names_a_run_without_a_profile_and_still_compares_the_repeat(tmp_path):
    """A run that never reached its profiled batch (no profile_b16.json) is named, not a traceback;
    the repeat pair that has both profiles is still compared."""
    def prof(ms, step):
        return {"uniform-random/16": dict(batch=16, budget=16, routing="uniform-random", graph_step_ms=step,
                                          graph_kernels=dict(gpu_busy_ms_per_step=step - 0.5, top_kernels=[
                                              dict(name="_base_route_kernel", ms_per_step=ms,
                                                   launches_per_step=48.0)]))}

    for name, doc in (("new", prof(0.3, 6.1)), ("old", None), ("new_2", prof(0.2, 5.7)), ("old_2", prof(0.4, 5.9))):
        (tmp_path / f"e2e_{name}").mkdir()
        (tmp_path / f"e2e_{name}" / "summary.json").write_text("{}")
        if doc:
            (tmp_path / f"e2e_{name}" / "profile_b16.json").write_text(json.dumps(doc))
    out = _run("profile", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("(not profiled: e2e_old has no profile_b16.json)")
    assert "repeat 2" in out.stdout and "| `_base_route_kernel` | 0.200 | 4.2 | 0.400 | 8.3 |" in out.stdout
    assert "| **graph step** | 5.700 | - | 5.900 | - |" in out.stdout


def test_read_floor_table_takes_the_fastest_launch_and_the_fastest_at_two_per_sm(tmp_path):
    def cell(programs, us, mode="all", ok=True):
        nbytes = 75_000_000 if mode == "all" else 50_000_000
        return dict(shape="qwen3-30b-a3b", T=16, M=8, mode=mode, experts_read=8, bytes=nbytes,
                    floor_us=25.0, programs=programs, chunk=16384, stages=4, warps=4, us=us,
                    x_floor=round(us / 25.0, 3), sum_ok=ok)
    cells = [cell(132, 30.0), cell(264, 27.5), cell(528, 26.0), cell(528, 20.0, ok=False),
             cell(264, 19.0, mode="up"), dict(cell(264, 31.0), pattern="tiles")]
    (tmp_path / "read_floor.json").write_text(json.dumps(
        {"gpu": "NVIDIA H100 80GB HBM3", "copy_bw_gbs": 3000.0, "cells": cells}))
    out = _run("read_floor", str(tmp_path))
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "read_floor.json").read_text())
    (tmp_path / "read_floor.json").write_text(json.dumps({**doc, "sms": 132,
                                                          "cells": doc["cells"][1:]}))
    recorded = _run("read_floor", str(tmp_path))  # no 132-program cell: the recorded count decides
    assert "at 264 programs" in recorded.stdout and "| 27.5 (1.10) |" in recorded.stdout
    rows = [x for x in out.stdout.splitlines() if x.startswith("| qwen3")]
    # the wrong sum (20.0 us) is not a result; 2 x the smallest grid = 264 programs
    assert rows[0] == ("| qwen3-30b-a3b | 16 | 8 | gate_up + down | 75.0 | 25.0 | 26.0 (1.04) | "
                       "528, 16384, 4, 4 | 27.5 (1.10) |")
    assert rows[1].startswith("| qwen3-30b-a3b | 16 | 8 | gate_up | 50.0 |") and "at 264 programs" in out.stdout
    assert rows[2].startswith("| qwen3-30b-a3b | 16 | 8 | gate_up + down, moe_one's tiles | 75.0 |")
    assert rows[2].endswith("| 31.0 (1.24) |")

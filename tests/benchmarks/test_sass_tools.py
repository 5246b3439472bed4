"""The two tools that place time inside the route-select launch without GPU counters here:
benchmarks/sass_count.py (its SASS for sm_90, compiled on this machine) and
benchmarks/gpu/ncu_summary.py (Nsight Compute's source page, summarised)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_scratch_row_shortens_the_qwen3_t16_launch(tmp_path):
    # D read back through the scratch row gives the top-M sort a one-per-thread layout: the
    # fifth session's change; its loss would bring back ~1000 instructions (Triton 3.6: 4016 -> 3000);
    # measured with the narrow backfill off (its no-scratch form spills 16 bytes under Triton 3.9)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # it compiles
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sass_count.py"), "--tiles",
                          "8,16,0,0,0", "8,16,0,1,0", "--json", str(tmp_path / "c.json")],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    without, with_row = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert without["stack"] == 0 and with_row["stack"] == 0
    assert with_row["instructions"] < 0.85 * without["instructions"], (with_row, without)


def test_narrow_backfill_shortens_the_qwen3_t16_path(tmp_path):
    # |S| <= 32: the backfill's top-k on a [16, 32] tile of S's columns instead of the [16, 128] one
    # (Triton 3.6: longest executed path 2597 with it off, 2124 through it, 2427 through the fallback)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sass_count.py"), "--tiles",
                          "8,16,0,1,0", "8,16,0,1,32", "--json", str(tmp_path / "c.json")],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    off, on = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert off["path_narrow"] is None and on["stack"] == 0
    assert on["path_narrow"] < 0.9 * off["path"], (on, off)
    assert on["path_full"] <= 1.02 * off["path"], (on, off)


def test_two_launches_shorten_the_qwen3_t64_chain(tmp_path):
    # base_route_split: each program routes its own 4 rows once, where the one launch repeats the
    # router and scoring of all four 16-row chunks in every program (Triton 3.6: longest path 5423
    # for the one launch, 770 + 1221 for the two; 25.5 against 11.3 us on the H200)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    runs = []
    for extra in ([], ["--split"]):
        out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sass_count.py"), "--tokens",
                              "64", *extra, "--json", str(tmp_path / "c.json")],
                             capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        runs.append(json.loads((tmp_path / "c.json").read_text())["rows"][0])
    one, two = runs
    assert two["stack"] == 0 and two["route_path"] > 0 and two["select_path"] > 0
    assert two["path"] == two["route_path"] + two["select_path"]
    assert two["path"] < 0.5 * one["path"], (two, one)


def _source_csv(path: Path) -> None:
    hdr = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "_base_route_kernel"])
        w.writerow(hdr)
        body = [("ISETP.GT.AND P0, PT, R1, R2, PT", 8)] * 150 + [("BAR.SYNC.DEFER_BLOCKING 0x0", 8)]
        body += [("@P0 SEL R1, R2, R3, P0", 8)] * 20 + [("EXIT", 8)]
        for i, (ins, n) in enumerate(body):
            w.writerow([hex(i * 16), "      " + ins, "0", str(n), "0", "0"])


def test_ncu_summary_counts_per_warp(tmp_path):
    _source_csv(tmp_path / "src.csv")
    (tmp_path / "det.txt").write_text(
        "  _base_route_kernel (1, 1, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n"
        "    Duration                         us        12.29\n"
        "    Registers Per Thread             register/thread             128\n"
        "    Warp Cycles Per Issued Instruction             cycle         5.19\n")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "ncu_summary.py"),
                          str(tmp_path / "src.csv"), str(tmp_path / "det.txt"), str(tmp_path / "s.json")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    (row,) = json.loads((tmp_path / "s.json").read_text())
    assert row["instructions"] == 172 and row["warp_instructions_executed"] == 172 * 8
    assert row["instructions_per_warp"] == 172  # 8 warps executed each instruction once
    assert row["runs_over_100"] == [[0, 151]]  # the 150 compares up to the barrier
    assert row["duration_us"] == 12.29 and row["registers"] == 128 and row["cycles_per_issue"] == 5.19
    assert row["top_opcodes_executed"][0] == ["ISETP", 1200]


def test_one_launch_moe_compiles_pipelined_with_the_trace_compiled_out(tmp_path):
    # kernels/moe_one.py for sm_90 at Qwen3 T = 16 with the tuned tiles: the interpreter runs the
    # kernel's Python, not its compile, so a construct only the GPU compile rejects shows here (a
    # ninth-session variant failed that way on the device). Both GEMM loops stream through shared
    # memory (LDGSTS: cp.async), two programs fit an SM (Triton 3.6: 188 registers, 108 KB with the
    # row's 4 stages), no spill, and the trace stamps are compiled out unless asked for. A register cap of 168 let a
    # third program fit while the row had 3 stages (72 KB); with 4 stages (108 KB, the T = 16 row
    # since the thirteenth session) shared memory allows only 2. With TMA
    # weight tiles (moe_one(tma=1); tma=2: the down tiles only) the weights arrive by bulk tensor copies (UTMALDG), only
    # the gathered activation rows by cp.async (Triton 3.6: 168 instead of 188 registers at T = 16,
    # with a 32 B spill; Triton 3.9: 179 both; the 4 stages' shared memory still allows only 2 per SM).
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    rows = []
    for extra in (["--maxnreg", "0", "168"], ["--trace"], ["--tma", "1"], ["--tma", "2"]):
        out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sass_count.py"), "--moe",
                              "--tokens", "16", *extra, "--json", str(tmp_path / "m.json")],
                             capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        rows += json.loads((tmp_path / "m.json").read_text())["rows"]
    plain, capped, traced, tma, tma_down = rows
    assert plain["one_launch"] and plain["ldgsts"] > 0 and plain["stack"] == 0
    assert plain["utmaldg"] == 0 and tma["utmaldg"] > 0 and tma["ldgsts"] < plain["ldgsts"]
    assert tma["tma"] == 1 and tma["stack"] <= 64
    assert tma_down["tma"] == 2 and 0 < tma_down["utmaldg"] < tma["utmaldg"]
    assert tma["ldgsts"] < tma_down["ldgsts"] < plain["ldgsts"]
    assert plain["programs_per_sm"] >= 2 and plain["shared"] <= 233472 // 2 - 1024
    assert not plain["globaltimer"] and traced["globaltimer"]
    assert (capped["maxnreg"], plain["maxnreg"]) == (168, 0) and capped["registers"] <= 168
    # the cap frees registers, but the row's 4 stages (thirteenth session) hold 108 KB of shared
    # memory, so shared memory, not registers, keeps it at 2 programs per SM
    assert capped["shared"] == plain["shared"] > 233472 // 3 - 1024
    assert capped["programs_per_sm"] == plain["programs_per_sm"] == 2
    assert capped["ldgsts"] == plain["ldgsts"]


def test_sass_count_refuses_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sass_count.py")],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "TRITON_INTERPRET=1" in out.stderr

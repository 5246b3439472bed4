"""Every kernel variant compiles for the H200 (sm_90a) with no local memory and pipelined GEMM loads
(benchmarks/compile_sm90.py --strict; no GPU needed). Slow: ~1 min of compiles."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sm90_variants_compile_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # real compiles
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/compile_sm90.py"), "--strict"],
                         capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert out.stdout.count("moe_up ") >= 15 and out.stdout.count("base_select ") >= 15

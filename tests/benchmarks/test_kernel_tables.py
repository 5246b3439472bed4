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

"""kernel_report.py: targets and BENCHMARKS.md tables from the benchmark JSON (old and new format)."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import kernel_report  # noqa: E402

RESULTS = ROOT / "benchmarks/results/kernels_h200"


def new_format(tmp_path):
    """A tiny run in today's format: one shape, T=16, M=8 and dense, SGLang align in and out."""
    rows = [dict(shape="qwen3-30b-a3b", T=16, M=8, union=44, experts_read=8, floor_us=17.9,
                 ours_us=25.0, ours_over_floor=1.397, up_us=16.0, config="default",
                 sglang_us=36.0, sglang_align="out", ours_over_sglang=0.694),
            dict(shape="qwen3-30b-a3b", T=16, M=16, union=44, experts_read=16, floor_us=35.8,
                 ours_us=46.0, ours_over_floor=1.285, up_us=30.0, config="default",
                 sglang_us=52.0, sglang_align="out", ours_over_sglang=0.885),
            dict(shape="qwen3-30b-a3b", T=16, M="dense", union=44, experts_read=44,
                 floor_us=98.5, ours_us=120.0, ours_over_floor=1.218, up_us=80.0,
                 config="pps2", sglang_us=116.0, sglang_align="out", ours_over_sglang=1.034)]
    sel = [dict(shape="qwen3-30b-a3b", T=16, M=16, launches=1, select_us=3.0, triton_us=3.1,
                triton_nopdl_us=3.6, torch_us=190.0, dense_moe_us=116.0, share_of_dense=0.0267)]
    meta = dict(gpu="NVIDIA H200", commit="abc1234", torch="2.11", triton="3.6.0")
    (tmp_path / "fused_moe.json").write_text(json.dumps({**meta, "rows": rows}))
    (tmp_path / "base_select.json").write_text(json.dumps({**meta, "rows": sel}))
    (tmp_path / "checks.json").write_text(json.dumps(
        {"gpu": "NVIDIA H200", "commit": "abc1234",
         "checks": [{"check": "a", "ok": True}, {"check": "b", "ok": False}]}))


def test_targets_from_a_new_format_run(tmp_path):
    new_format(tmp_path)
    moe = kernel_report.load(tmp_path / "fused_moe.json")
    sel = kernel_report.load(tmp_path / "base_select.json")
    got = {name: met for name, met, _ in kernel_report.targets(moe, sel)}
    assert got["selection <= 3% of dense, qwen3-30b-a3b T=16"] is True
    assert got["selection <= 3% of dense, olmoe-1b-7b T=16"] is None  # not measured
    assert got["BASE M=16 within 1.25x of its byte floor, qwen3-30b-a3b T=16"] is False
    assert got["BASE M=8 within 1.5x of its byte floor, qwen3-30b-a3b T=16"] is True
    assert got["dense ours <= SGLang at every T <= 64, qwen3-30b-a3b"] is False


def test_markdown_block_is_replaced(tmp_path):
    new_format(tmp_path)
    md = tmp_path / "B.md"
    md.write_text(f"intro\n{kernel_report.BEGIN}\nstale\n{kernel_report.END}\noutro\n")
    sys.argv = ["kernel_report.py", "--dir", str(tmp_path), "--markdown", str(md)]
    assert kernel_report.main() == 0
    text = md.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "stale" not in text
    assert "| 16 | 25.0 (1.40) / 36.0 [8] |" in text and "1/2 passed; failed: b" in text
    assert "| qwen3-30b-a3b | 16 | dense | 120.0 | 80.0 | 40.0 | pps2 |" in text


def test_committed_results_regenerate_the_committed_tables():
    """BENCHMARKS.md's kernel tables are exactly what the committed JSON produces."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    block = text.split(kernel_report.BEGIN, 1)[1].split(kernel_report.END, 1)[0]
    want = kernel_report.markdown(kernel_report.load(RESULTS / "fused_moe.json"),
                                  kernel_report.load(RESULTS / "base_select.json"),
                                  kernel_report.load(RESULTS / "checks.json"))
    assert kernel_report.BEGIN + block + kernel_report.END == want

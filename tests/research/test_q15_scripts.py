"""research/alpha_scan.py and research/onpolicy_r2.py on a tiny calibrated Qwen3-MoE checkpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "calibration"))
import tiny  # noqa: E402

from research import alpha_scan, onpolicy_r2  # noqa: E402


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from base_sglang.calibration.__main__ import main as calibrate_main

    root = tmp_path_factory.mktemp("q15")
    docs = tiny.synthetic_docs(48)
    data = tiny.write_text(root / "docs.txt", docs)
    ckpt = tiny.make_checkpoint("qwen3_moe", root / "ckpt", docs)
    pred = root / "p.safetensors"
    assert calibrate_main(["--model", str(ckpt), "--data", str(data), "--out", str(pred),
                           "--num-seqs", "16", "--seq-len", "24", "--heldout-every", "4",
                           "--stat-batch", "4", "--quiet"]) == 0
    return ["--model", str(ckpt), "--predictor", str(pred), "--data", str(data), "--split", "all",
            "--batch-size", "4", "--num-batches", "1", "--prefix", "8", "--steps", "4"], root


def test_alpha_scan_pairs_against_the_reference_alpha(paths, capsys):
    args, root = paths
    out = root / "alpha"
    assert alpha_scan.main([*args, "--out", str(out), "--budgets", "1", "2", "--alphas", "0", "0.5", "1"]) == 0
    rows = json.loads(Path(str(out) + ".json").read_text())["rows"]
    assert {(r["policy"], r["alpha"], r["M"]) for r in rows} == {
        (p, a, m) for p in ("base_plus", "oracle_plus") for a in (0.0, 0.5, 1.0) for m in (1, 2)}
    by = {(r["name"], r["alpha"]): r for r in rows}
    for r in rows:
        if r["alpha"] == 0.5:  # the reference against itself
            assert r["paired_vs_ref"] == 0.0 and r["paired_vs_ref_se"] == 0.0
        else:
            ref = by[(r["name"], 0.5)]
            assert r["paired_vs_ref"] == pytest.approx(r["dnll"] - ref["dnll"], abs=2e-5)
    # M = 1 < top-k = 2: every token loses a slot, so the combine exponent changes the output
    assert by[("base_plus M=1", 0.0)]["dnll"] != by[("base_plus M=1", 1.0)]["dnll"]
    md = alpha_scan.table(str(out) + ".json")
    assert md.count("\n") == 1 + 4 and "| base_plus | 1 |" in md and "(z " in md
    assert "alpha=" in capsys.readouterr().out


def test_alpha_scan_rejects_an_alpha_out_of_range(paths):
    args, root = paths
    with pytest.raises(SystemExit):
        alpha_scan.main([*args, "--out", str(root / "bad"), "--alphas", "1.5"])


def test_onpolicy_r2_layer0_does_not_see_the_pruning(paths):
    args, root = paths
    out = root / "onp"
    assert onpolicy_r2.main([*args, "--out", str(out), "--budgets", "1"]) == 0
    rows = json.loads(Path(str(out) + ".json").read_text())["rows"]
    by = {(r["setting"], r["layer"]): r for r in rows}
    layers = sorted({r["layer"] for r in rows})
    assert {r["setting"] for r in rows} == {"dense", "base_plus M=1"}
    for j in layers:
        assert by[("dense", j)]["pairs"] == 4 * 4 * 2  # steps x B x top-k: decode steps, no prefill
        assert by[("dense", j)]["r2"] <= 1.0
    # the first MoE layer's input comes from the dense prefill's cache and the true token only
    first = layers[0]
    assert by[("dense", first)]["r2"] == by[("base_plus M=1", first)]["r2"]
    # deeper layers see the pruned trajectory: their inputs, hence their errors, differ
    assert any(by[("dense", j)]["r2"] != by[("base_plus M=1", j)]["r2"] for j in layers[1:])
    assert onpolicy_r2.table(str(out) + ".json").count("\n") == 1 + len(layers)

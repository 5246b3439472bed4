"""The predictor-options study on a tiny checkpoint: its linear option is base-calibrate's predictor."""

from __future__ import annotations

import json

import pytest

from base_sglang.calibration.__main__ import main as calibrate_main
from base_sglang.calibration.predictor_study import main, serving_cost

ARGS = ["--num-seqs", "16", "--seq-len", "24", "--heldout-every", "4"]


def test_linear_option_reproduces_base_calibrate(tiny_ckpt, tiny_data, tmp_path):
    ckpt = tiny_ckpt("qwen3_moe")
    pred = tmp_path / "p.safetensors"
    assert calibrate_main(["--model", str(ckpt), "--data", str(tiny_data), "--out", str(pred),
                           *ARGS, "--stat-batch", "4", "--quiet"]) == 0
    assert main(["--model", str(ckpt), "--data", str(tiny_data), "--out", str(tmp_path / "s"),
                 "--options", "linear,router,quad16", "--batch-size", "4", *ARGS]) == 0
    res = json.loads((tmp_path / "s.json").read_text())
    from base_sglang.core import Predictor

    fit = Predictor.load(pred).meta.fit_stats
    for layer, opts in res["layers"].items():
        assert opts["linear"]["r2"] == pytest.approx(fit[layer]["r2"], abs=2e-3)
        assert opts["linear"]["spearman_cost"] == pytest.approx(fit[layer]["spearman_cost"], abs=2e-3)
        for o in ("router", "quad16"):
            assert -10 < opts[o]["r2"] <= 1 and 0 <= opts[o]["energy_oracle@2"] <= 1 + 1e-6
    assert main(["--model", str(ckpt), "--data", str(tiny_data), "--out", str(tmp_path / "x"),
                 "--options", "linear,cubic"]) == 2


def test_serving_cost_formulas():
    assert serving_cost("linear", 2048, 128, 8) == {"features": 2048, "macs_per_token": 8 * 2048,
                                                    "bytes_per_layer": 2 * 128 * 2049}
    q = serving_cost("quad32", 2048, 128, 8)
    assert q["features"] == 2048 + 528 and q["macs_per_token"] == 32 * 2048 + 8 * 2576 + 1024

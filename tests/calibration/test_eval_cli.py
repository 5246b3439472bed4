"""base-eval end to end on a tiny random Qwen3-MoE: identities, budgets, outputs, errors."""

from __future__ import annotations

import csv
import importlib.util
import json
import math

import pytest

from base_sglang.calibration.calibrate import main as calibrate_main
from base_sglang.calibration.eval import main

SMALL = ["--batch-size", "4", "--num-batches", "1", "--prefix", "8", "--steps", "4", "--quiet"]


@pytest.fixture(scope="module")
def tiny_pred(tiny_ckpt, tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("pred") / "p.safetensors"
    assert calibrate_main(["--model", str(tiny_ckpt("qwen3_moe")), "--data", str(tiny_data),
                           "--out", str(out), "--num-seqs", "16", "--seq-len", "24",
                           "--heldout-every", "4", "--stat-batch", "4", "--quiet"]) == 0
    return out


def test_eval_sweep_outputs_and_identities(tiny_ckpt, tiny_data, tiny_pred, tmp_path):
    stem = tmp_path / "res" / "q"
    rc = main(["--model", str(tiny_ckpt("qwen3_moe")), "--predictor", str(tiny_pred), "--data",
               str(tiny_data), "--out", str(stem), "--policies", "base,oracle,gate_sum,sere,oea",
               "--budgets", "2", "8", *SMALL])
    assert rc == 0
    res = json.loads(stem.with_suffix(".json").read_text())
    if importlib.util.find_spec("matplotlib") is not None:  # the plot needs matplotlib (dev extra)
        assert stem.with_suffix(".png").stat().st_size > 1000
    with open(stem.with_suffix(".csv")) as f:
        assert len(list(csv.DictReader(f))) == len(res["rows"])
    rows = {r["setting"]: r for r in res["rows"]}
    dense = rows["dense"]
    assert dense["dppl_pct"] == 0 and dense["agree"] == 1 and dense["energy"] == pytest.approx(1.0)
    assert dense["tokens"] == 4 * 4 and dense["experts"] == dense["union"] > 2
    # M = 8 = E: every routed expert is kept, so BASE reproduces the dense run exactly
    for name in ("base M=8", "oracle M=8", "gate_sum M=8"):
        r = rows[name]
        assert r["dnll"] == 0 and r["agree"] == 1 and r["kl"] == pytest.approx(0, abs=1e-9)
        assert r["experts"] == pytest.approx(dense["experts"])
    for name in ("base M=2", "oracle M=2", "gate_sum M=2"):
        r = rows[name]
        assert r["experts"] <= 2 + 1e-9 and r["energy"] < 1 and r["kl"] >= 0
        assert r["ppl"] == pytest.approx(math.exp(r["nll"]))
    assert rows["oea k0=1"]["experts"] < dense["experts"]
    c = res["checks"]
    assert {e["M"] for e in c["matched_budget"]} == {2, 8}
    assert c["predictor_spearman_min"] > 0.5
    assert res["meta"]["settings"]["batch_size"] == 4 and res["meta"]["commit"]


def test_eval_default_policy_oracle_plus_and_error_targets(tiny_ckpt, tiny_data, tiny_pred, tmp_path):
    stem = tmp_path / "plus"
    assert main(["--model", str(tiny_ckpt("qwen3_moe")), "--predictor", str(tiny_pred), "--data",
                 str(tiny_data), "--out", str(stem), "--policies", "base_plus,oracle_plus,base",
                 "--budgets", "2", "8", "--max-errors", "0", "1", *SMALL]) == 0
    res = json.loads(stem.with_suffix(".json").read_text())
    rows = {r["setting"]: r for r in res["rows"]}
    for name in ("base_plus M=8", "oracle_plus M=8", "base_plus err=0"):  # nothing removed: dense
        assert rows[name]["dnll"] == 0 and rows[name]["agree"] == 1, name
    assert rows["base_plus err=1"]["experts"] == pytest.approx(1.0)  # any error allowed: M = 1
    assert rows["base_plus M=2"]["experts"] <= 2 + 1e-9
    c = res["checks"]
    assert c["policy"] == "base_plus" and {e["M"] for e in c["matched_budget"]} == {2, 8}
    assert "over_oracle_plus" in c["matched_budget"][0]
    assert all(e["policy"] != "base_plus_err" for e in c["matched_interp"])


def test_eval_errors_name_the_field(tiny_ckpt, tiny_data, tiny_pred, tmp_path, capsys):
    base = ["--model", str(tiny_ckpt("qwen3_moe")), "--data", str(tiny_data), "--out", str(tmp_path / "x")]
    cases = [
        (["--predictor", str(tiny_pred), "--policies", "base,magic", *SMALL], "policies"),
        (["--policies", "base", *SMALL], "predictor"),
        (["--policies", "oea", "--max-errors", "0.1", *SMALL], "predictor"),
        (["--predictor", str(tiny_pred), "--policies", "oea", "--max-errors", "2", *SMALL],
         "max_errors"),
        (["--predictor", str(tiny_pred), "--policies", "base_plus", "--renorm-alpha", "2", *SMALL],
         "renorm_alpha"),
        (["--predictor", str(tiny_pred), "--policies", "oea", "--batch-size", "0"], "batch-size"),
        (["--predictor", str(tiny_pred), "--policies", "oea", "--batch-size", "500"], "data"),
        (["--predictor", str(tiny_ckpt("qwen3_moe")) + "/nope.safetensors", "--policies", "base"],
         "predictor"),
    ]
    for argv, word in cases:
        assert main(base + argv) == 2
        err = capsys.readouterr().err
        assert "error" in err and word in err, (argv, err)


def test_eval_rejects_predictor_of_another_model(tiny_ckpt, tiny_data, tiny_pred, tmp_path, capsys):
    rc = main(["--model", str(tiny_ckpt("mixtral")), "--predictor", str(tiny_pred), "--data",
               str(tiny_data), "--out", str(tmp_path / "x"), "--policies", "base", *SMALL])
    assert rc == 2
    assert "'architecture'" in capsys.readouterr().err

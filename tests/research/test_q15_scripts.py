"""research/alpha_scan.py and research/onpolicy_r2.py on a tiny calibrated Qwen3-MoE checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from research import alpha_scan, onpolicy_r2


@pytest.fixture(scope="module")
def paths(tiny_files, tmp_path_factory):
    ckpt, pred, data = tiny_files
    return ["--model", str(ckpt), "--predictor", str(pred), "--data", str(data), "--split", "all",
            "--batch-size", "4", "--num-batches", "1", "--prefix", "8", "--steps", "4"], \
        tmp_path_factory.mktemp("q15")


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


def test_onpolicy_fit_without_drops_equals_the_dense_refit(paths):
    """Collected at M = E (nothing dropped) the on-policy rows are the dense rows up to float rounding
    (base_plus's combine path), so the same fit; at M = 1, 2 they differ. Row counts: the prefill once, the decode rows once per collect budget."""
    import torch

    from base_sglang.core import Predictor
    from research import onpolicy_fit

    args, root = paths
    args = [a for a in args if a not in ("--split", "all")]  # scored on tune (the fit uses calib)
    common = [*args, "--collect-batches", "1", "--budgets", "1", "--save"]
    same, diff = root / "fit_same", root / "fit_diff"
    assert onpolicy_fit.main([*common, "--out", str(same), "--collect-budgets", "8"]) == 0
    a = Predictor.load(f"{same}_refit_dense.safetensors")
    b = Predictor.load(f"{same}_refit_onpolicy.safetensors")
    assert torch.allclose(a.weight, b.weight, atol=1e-5) and torch.allclose(a.bias, b.bias, atol=1e-5)
    shipped = Predictor.load(args[args.index("--predictor") + 1])
    assert not torch.equal(a.weight, shipped.weight)
    assert torch.equal(a.exfold_coef, shipped.exfold_coef)  # every other tensor kept
    assert onpolicy_fit.main([*common, "--out", str(diff), "--collect-budgets", "1", "2"]) == 0
    c = Predictor.load(f"{diff}_refit_onpolicy.safetensors")
    gap = (c.weight - Predictor.load(f"{diff}_refit_dense.safetensors").weight).abs().max()
    assert gap > 1e-3  # far beyond the rounding above
    out = json.loads(Path(f"{diff}.json").read_text())
    fit = out["meta"]["train_fit"]
    for tag in ("refit_dense", "refit_onpolicy"):  # 4 rows x (8 prefill + 2 budgets x 4 steps) x top-2
        assert {v["fit_pairs"] for v in fit[tag].values()} == {4 * (8 + 2 * 4) * 2}
    rows = {(r["predictor"], r["M"]): r for r in out["rows"]}
    assert set(rows) == {(t, 1) for t in ("shipped", "refit_dense", "refit_onpolicy", "oracle")}
    assert rows[("shipped", 1)]["paired_vs_shipped"] == 0.0
    assert "| 1 |" in onpolicy_fit.table(f"{diff}.json")


def test_onpolicy_fit_with_calibration_rows(paths):
    from research import onpolicy_fit

    args, root = paths
    args = [a for a in args if a not in ("--split", "all")]
    out = root / "fit_calib"
    assert onpolicy_fit.main([*args, "--collect-batches", "1", "--budgets", "1", "--collect-budgets", "1",
                              "--with-calib-rows", "--out", str(out)]) == 0
    res = json.loads(Path(f"{out}.json").read_text())
    assert {r["predictor"] for r in res["rows"]} == {"shipped", "calib+dense", "calib+onpolicy", "oracle"}
    decode_only = 4 * (8 + 4) * 2  # rows x (prefix + steps) x top-2
    for tag in ("calib+dense", "calib+onpolicy"):  # base-calibrate's fit windows come first
        assert min(v["fit_pairs"] for v in res["meta"]["train_fit"][tag].values()) > decode_only

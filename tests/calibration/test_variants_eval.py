"""Issue-13 variants in the evaluation: sweep settings, own-oracle checks, merging result files, the
variants tables, and the layer-schedule allocation (hand-computed cases)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from base_sglang.calibration.layer_schedule import allocate, curve_values, schedule_table
from base_sglang.calibration.sweep import (
    ALL_POLICIES,
    DEFAULT_POLICIES,
    build_settings,
    check_targets,
    merge,
    own_oracle,
)
from base_sglang.calibration.tables import variants, vtargets


def _row(policy, value, experts, dppl, se=0.001):
    return {"setting": f"{policy} M={value}", "policy": policy, "value": value, "experts": experts,
            "dppl_pct": dppl, "dnll": dppl / 100, "dnll_se": se, "ppl": 5.0, "nll": 1.0,
            "tokens": 64, "agree": 0.9, "kl": 0.01}


def _meta(batch=8):
    return {"model": "m", "num_experts": 32, "top_k": 8, "dense_union": 30.0, "seconds": 1.0,
            "commit": "abc", "dirty": False, "torch": "t", "transformers": "5.17.0",
            "command": "base-eval ...", "settings": {"batch_size": batch, "num_batches": 1,
                                                     "prefix": 4, "steps": 8}}


def test_settings_for_the_variants():
    assert "base_net" in ALL_POLICIES and "base_net" not in DEFAULT_POLICIES
    assert "oracle_plus" in DEFAULT_POLICIES and "base_plus" in DEFAULT_POLICIES
    s = build_settings(["base_net", "oracle_net", "base_sched", "oracle_sched"], 64, 8, [8, 16],
                       net_lambda=0.25, net_iters=3)[1:]
    assert [(x.policy, x.budget) for x in s] == [(p, m) for p in ("base_net", "oracle_net", "base_sched",
                                                                  "oracle_sched") for m in (8, 16)]
    assert all(x.config.net_lambda == 0.25 and x.config.net_iters == 3 for x in s[:4])
    assert all(x.config.combine_mode(True) == "partial" for x in s)


def _variant_rows():
    return [_row("dense", "-", 30, 0.0),
            _row("base_plus", 8, 8, 20.0), _row("base_plus", 16, 16, 5.0),
            _row("oracle_plus", 8, 8, 18.5), _row("oracle_plus", 16, 16, 4.8),
            _row("base_net", 8, 8.0, 18.0), _row("base_net", 16, 16.0, 6.0),
            _row("oracle_net", 8, 8, 17.0), _row("oracle_net", 16, 16, 5.0)]


def test_own_oracle_and_variant_against_base_plus():
    rows = _variant_rows()
    o = own_oracle(rows, "base_net", top_k=8)
    assert [(e["M"], round(e["over"], 4), e["within_10pct"]) for e in o["per_M"]] == [
        (8, round(18 / 17, 4), True), (16, 1.2, False)]
    assert o["all_within_10pct"] is False and o["oracle"] == "oracle_net"
    c = check_targets(rows, None, None, top_k=8)
    assert c["policy"] == "base_plus" and "base_net" in c["own_oracle"]
    interp = {e["setting"]: e for e in c["matched_interp"]}
    assert "oracle_net M=8" not in interp  # oracles are references, not competitors
    assert interp["base_net M=8"]["beats_ref"] and not interp["base_net M=16"]["beats_ref"]
    assert interp["base_net M=8"]["significant"]  # 0.02 nats vs se 0.0014
    res = {"meta": _meta(), "rows": rows, "checks": c}
    text = variants(res)
    line8 = next(ln for ln in text.splitlines() if ln.startswith("| 8 |"))
    assert "| 20.0 | 18.5 | 18.0 | 17.0 | 1.08 ok | 1.06 ok |" in line8
    row = vtargets([res]).splitlines()[2]
    assert "| base_net | **missed**: worst 1.20x at M=16 | 8* | 16* | - |" in row


def test_merge_adds_baseline_rows_and_checks_the_variant_as_reference(tmp_path):
    new = {"meta": _meta(), "rows": _variant_rows()}
    old_rows = [_row("dense", "-", 30, 0.0), _row("base_plus", 8, 8, 99.0),  # new file's row wins
                _row("gate_sum", 12, 12.0, 11.0)]
    old = {"meta": _meta(), "rows": old_rows}
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "m.json"
    a.write_text(json.dumps(new))
    b.write_text(json.dumps(old))
    res = merge(str(out), [str(a), str(b)])
    by = {(r["policy"], r["value"]): r for r in res["rows"]}
    assert by[("base_plus", 8)]["dppl_pct"] == 20.0 and by[("gate_sum", 12)]["source"] == str(b)
    ref = res["checks_by_ref"]["base_net"]
    # base_net at cost 12: halfway 18 -> 6 = 12.0 > gate_sum's 11.0; base_plus beats it at M=16 (5 < 6),
    # not at M=8 (20 > 18)
    assert ref["policy"] == "base_net" and ref["beaten_by"] == ["base_plus M=16", "gate_sum M=12"]
    assert json.loads(out.read_text())["meta"]["merged_from"][1]["path"] == str(b)
    row = vtargets([res]).splitlines()[2]  # base_plus is not a "baseline" in the last column
    assert row.endswith("| gate_sum M=12 (12.0 exp.: 11.0 vs 12.0 %) > 2 SE |")
    other = {"meta": _meta(batch=16), "rows": old_rows}
    b.write_text(json.dumps(other))
    with pytest.raises(ValueError, match="merge"):
        merge(str(out), [str(a), str(b)])


def test_curve_values_interpolate_to_zero_at_dense_and_never_increase():
    assert curve_values([(1, 10.0), (2, 1.0), (3, 0.5)], 4, 1).tolist() == [10.0, 1.0, 0.5, 0.0]
    # noise: 6 at M=2 above 5 at M=1 -> held at 5; interpolated 3 at M=3 (6 -> 0 over 2..4)
    assert curve_values([(1, 5.0), (2, 6.0)], 4, 1).tolist() == [5.0, 5.0, 3.0, 0.0]
    assert curve_values([(1, -0.1)], 2, 1).tolist() == [0.0, 0.0]  # negative noise -> 0
    with pytest.raises(ValueError, match="curve"):
        curve_values([(2, 1.0)], 4, 1)


def test_allocate_is_the_exact_minimum_with_the_same_total():
    a = curve_values([(1, 10.0), (2, 1.0), (3, 0.5)], 4, 1)  # [10, 1, 0.5, 0]
    b = curve_values([(1, 2.0), (2, 1.5), (3, 1.0)], 4, 1)  # [2, 1.5, 1, 0]
    # m = 2 (total 4): (1,3) 11, (2,2) 2.5, (3,1) 2.5 -> the tie goes to the uniform split
    assert allocate([a, b], 4, 1, 2) == [2, 2]
    # m = 3 (total 6): (2,4) 1.0, (3,3) 1.5, (4,2) 1.5
    assert allocate([a, b], 4, 1, 3) == [2, 4]
    # non-convex: d gains 1 then 18 (a greedy step would split), c gains 1; E = 16 >> the total
    c = curve_values([(1, 9.0), (2, 8.0)], 16, 1)
    d = curve_values([(1, 20.0), (2, 19.0), (3, 1.0)], 16, 1)
    assert allocate([d, c], 16, 1, 2) == [3, 1]
    assert allocate([a, b], 4, 2, 1) == [1, 1]  # below the lowest measured budget: uniform
    assert allocate([a, b], 4, 1, 4) == [4, 4]  # dense stays dense
    table = schedule_table({0: [(1, 10.0), (2, 1.0), (3, 0.5)], 5: [(1, 2.0), (2, 1.5), (3, 1.0)]},
                           [0, 5], 4, 1)
    assert table.tolist() == [[0, 1, 2, 2, 4], [0, 1, 2, 4, 4]]
    assert np.all(table.sum(0) == 2 * np.arange(5))
    capped = schedule_table({0: [(1, 10.0), (2, 1.0), (3, 0.5)], 5: [(1, 2.0), (2, 1.5), (3, 1.0)]},
                            [0, 5], 4, 1, up_to=2)
    assert capped.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]  # m = 3 > up_to: uniform


def test_layer_schedule_cli_end_to_end_and_base_sched_eval(tiny_ckpt, tiny_data, tmp_path):
    """Measure curves on the tiny model (calib split), write predictor + table, rebuild it from the
    curves without touching the record, and run base_sched / oracle_sched through base-eval."""
    from base_sglang.calibration.calibrate import main as calibrate_main
    from base_sglang.calibration.eval import main as eval_main
    from base_sglang.calibration.layer_schedule import main
    from base_sglang.core import Predictor

    model = str(tiny_ckpt("qwen3_moe"))
    pred = tmp_path / "p.safetensors"
    assert calibrate_main(["--model", model, "--data", str(tiny_data), "--out", str(pred),
                           "--num-seqs", "16", "--seq-len", "24", "--heldout-every", "4",
                           "--stat-batch", "4", "--quiet"]) == 0
    small = ["--batch-size", "2", "--num-batches", "1", "--prefix", "6", "--steps", "3"]
    stem = tmp_path / "s"
    assert main(["--model", model, "--predictor", str(pred), "--data", str(tiny_data), "--out",
                 str(stem), "--budgets", "1", "2", "--up-to", "3", *small]) == 0
    rec = json.loads(stem.with_suffix(".json").read_text())
    p = Predictor.load(stem.with_suffix(".safetensors"))
    E, L = p.meta.num_experts, len(p.meta.moe_layers)
    assert rec["meta"]["split"] == "calib" and sorted(map(int, rec["curves"])) == p.meta.moe_layers
    assert p.layer_budget.shape == (L, E + 1)
    assert p.layer_budget.sum(0).tolist() == [L * m for m in range(E + 1)]  # same total per step
    assert all(p.layer_budget[:, m].tolist() == [m] * L for m in range(4, E + 1))  # above --up-to
    before = stem.with_suffix(".json").read_text()
    assert main(["--model", model, "--predictor", str(pred), "--data", str(tiny_data), "--out",
                 str(stem), "--curves", str(stem.with_suffix(".json")), "--up-to", "0"]) == 0
    assert stem.with_suffix(".json").read_text() == before  # the measured record is kept
    assert Predictor.load(stem.with_suffix(".safetensors")).layer_budget[:, 2].tolist() == [2] * L
    out = tmp_path / "e"
    assert eval_main(["--model", model, "--predictor", str(stem.with_suffix(".safetensors")),
                      "--data", str(tiny_data), "--out", str(out), "--policies",
                      "base_plus,base_sched,oracle_sched,base_net,oracle_net", "--budgets", "2",
                      "--quiet", "--batch-size", "4", "--num-batches", "1", "--prefix", "8",
                      "--steps", "4"]) == 0
    rows = {r["setting"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    # --up-to 0: the schedule is uniform, so base_sched is base_plus exactly
    assert rows["base_sched M=2"]["nll"] == rows["base_plus M=2"]["nll"]
    assert rows["oracle_net M=2"]["experts"] <= 2 and rows["base_net M=2"]["experts"] <= 2

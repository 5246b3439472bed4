"""The sweep grid and the matched-cost target checks, on hand-made result rows."""

from __future__ import annotations

from base_sglang.calibration.sweep import build_settings, check_targets, default_budgets


def test_default_budgets_and_grid():
    assert default_budgets(64, 8, 51.6) == [4, 8, 12, 16, 24, 26, 32, 40, 48]
    assert default_budgets(8, 2, 5.4) == [1, 2, 3, 4, 6]  # half union 3 merges with 1.5k; 8 >= E dropped
    s = build_settings(["base", "exfold", "oea", "lynx", "oracle_plus"], 64, 8, [16, 24],
                       renorm="never", backfill=False, lynx_taus=(1.0, 0.0625))
    names = [x.name for x in s]
    assert names[0] == "dense" and "base M=16" in names and "exfold D=24" in names
    assert [x.budget for x in s if x.policy == "base"] == [16, 24]
    assert all(x.config.renorm == "never" and not x.config.backfill
               for x in s if x.policy in ("base", "oea", "lynx", "oracle_plus"))
    plus = build_settings(["base_plus", "oracle_plus"], 64, 8, [16])
    assert [(x.policy, x.config.policy, x.config.combine_mode(True)) for x in plus[1:]] == [
        ("base_plus", "base_plus", "partial"), ("oracle_plus", "oracle", "partial")]
    assert all(x.config.renorm == "native" for x in s if x.policy == "exfold")  # ExFold never renorms
    assert {x.config.lynx_tau for x in s if x.policy == "lynx"} == {1.0, 0.0625}
    assert [x.config.oea_k0 for x in s if x.policy == "oea"] == list(range(1, 8))


def _row(policy, value, experts, dppl, se=0.001):
    return {"policy": policy, "value": value, "experts": experts, "dppl_pct": dppl,
            "dnll": dppl / 100, "dnll_se": se, "setting": f"{policy} {value}"}


def test_check_targets():
    rows = [_row("dense", "-", 50, 0.0),
            _row("base_plus", 8, 8, 60.0),
            _row("base_plus", 16, 16, 20.0), _row("base_plus", 24, 24, 4.0),
            _row("base_plus", 25, 25, 1.5),
            _row("base", 16, 16, 25.0),
            _row("oracle", 8, 8, 40.0), _row("oracle", 16, 16, 19.0), _row("oracle", 24, 24, 3.0),
            _row("oracle", 25, 25, 1.4), _row("oracle_plus", 16, 16, 18.5),
            _row("gate_sum", 16, 16, 30.0), _row("gate_sum", 24, 24, 3.5),
            _row("oea", 2, 20, 10.0), _row("sere", "1/0.0", 30, 50.0),
            _row("exfold", 25, 25.3, 1.45, se=0.01)]
    c = check_targets(rows, half_m=25, fit_stats={"0": {"spearman_cost": 0.95},
                                                  "1": {"spearman_cost": 0.88}}, top_k=16)
    assert c["policy"] == "base_plus"
    by_m = {e["M"]: e for e in c["matched_budget"]}
    assert by_m[16]["within_10pct_of_oracle"] and by_m[16]["paper_base_dppl_pct"] == 25.0
    assert not by_m[24]["within_10pct_of_oracle"]  # 4 > 3.3
    assert not by_m[8]["within_10pct_of_oracle"]  # below top_k: reported, not checked
    assert by_m[16]["within_10pct_of_oracle_plus"] and by_m[16]["over_oracle_plus"] == 20 / 18.5
    interp = {e["setting"]: e for e in c["matched_interp"]}
    assert interp["oea 2"]["ref_interp_dppl_pct"] == 12.0  # halfway between 20 and 4
    assert interp["oea 2"]["beats_ref"] is True and interp["oea 2"]["dnll_margin"] > 0
    assert interp["gate_sum 24"]["beats_ref"] is True and interp["gate_sum 16"]["beats_ref"] is False
    assert interp["base 16"]["beats_ref"] is False  # the paper's BASE is one of the others
    assert interp["sere 1/0.0"]["beats_ref"] is None  # cost 30 is outside the measured range
    # a cost just above the measured range (budget >= union) compares with its end: beaten, in noise
    assert interp["exfold 25"]["beats_ref"] is True and interp["exfold 25"]["significant"] is False
    assert interp["oea 2"]["significant"] is True  # 0.02 nats apart, SEs 0.001
    assert c["unbeaten"] is False and set(c["beaten_by"]) == {"oea 2", "gate_sum 24", "exfold 25"}
    assert set(c["beaten_significantly_by"]) == {"oea 2", "gate_sum 24"}
    assert by_m[24]["oracle_gap_significant"] is True
    assert c["all_within_10pct_of_oracle"] is False and c["all_within_10pct_of_oracle_plus"] is True
    assert c["half_union_within_2pct"] is True and c["half_union_dppl_pct"] == 1.5
    assert c["predictor_spearman_min"] == 0.88 and c["predictor_spearman_ok"] is False
    # without base_plus rows the checks are about the paper's BASE
    assert check_targets([r for r in rows if r["policy"] != "base_plus"], None, None)["policy"] == "base"


def test_recheck_rewrites_the_checks_from_the_rows(tmp_path):
    import json

    from base_sglang.calibration.sweep import recheck

    rows = [_row("dense", "-", 50, 0.0), _row("base_plus", 16, 16, 20.0), _row("oracle", 16, 16, 19.0)]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"meta": {"top_k": 8}, "rows": rows, "checks": {"stale": 1}}))
    recheck([str(path)])
    c = json.loads(path.read_text())["checks"]
    assert "stale" not in c and c["all_within_10pct_of_oracle"] is True and c["unbeaten"] is True

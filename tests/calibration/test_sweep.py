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


def _paired_case():
    """Per-token increases where a shared per-token noise hides a 0.01-nat gap from the unpaired SE
    (each setting's mean is uncertain by ~0.016) but not from the paired one (the gap is constant)."""
    import torch

    g = torch.Generator().manual_seed(0)
    noise = torch.randn(4096, generator=g, dtype=torch.float64)  # [N] shared by every setting
    d = {"base_plus 8": 0.60 + noise, "base_plus 16": 0.20 + noise, "base_plus 24": 0.04 + noise,
         "oracle 16": 0.19 + noise, "oracle_plus 16": 0.20 + noise + 0.001 * torch.randn(4096, generator=g),
         "gate_sum 20": 0.11 + noise, "oea 2": 0.13 + noise}
    rows = [_row("dense", "-", 50, 0.0)]
    for name, arr in d.items():
        p, v = name.split()
        cost = {"gate_sum 20": 20.0, "oea 2": 20.0}.get(name, float(v))
        se = float(arr.std() / 4096 ** 0.5)
        rows.append(dict(_row(p, int(v), cost, 100 * float(arr.mean()), se=se), dnll=float(arr.mean())))
    return rows, d


def test_paired_z_finds_what_the_unpaired_test_cannot():
    from base_sglang.calibration.sweep import _interp, _interp_weights, paired_z

    rows, d = _paired_case()
    c = check_targets(rows, None, None, top_k=8, tokens=d)
    by_m = {e["M"]: e for e in c["matched_budget"]}
    assert by_m[16]["oracle_gap_significant"] is False  # unpaired: 0.01 nats inside 2 x ~0.022
    assert by_m[16]["oracle_paired_z"] > 100  # paired: the constant gap, exactly 0.01 every token
    assert abs(by_m[16]["oracle_plus_paired_z"]) < 3  # the same up to 0.001 noise
    interp = {e["setting"]: e for e in c["matched_interp"]}
    # at cost 20 base_plus's curve is halfway between M=16 (0.20) and M=24 (0.04): 0.12 + noise
    assert abs(_interp([16.0, 24.0], [20.0, 4.0], 20.0) - 12.0) < 1e-12
    assert _interp_weights([24.0, 16.0], [4.0, 20.0], 20.0) == (1, 0, 0.5)  # sorted by cost first
    assert interp["gate_sum 20"]["beats_ref"] is True and interp["gate_sum 20"]["significant"] is False
    assert interp["gate_sum 20"]["paired_z"] > 100 and interp["gate_sum 20"]["significant_paired"]
    assert interp["oea 2"]["beats_ref"] is False and interp["oea 2"]["paired_z"] < -100
    assert c["beaten_significantly_by"] == [] and c["beaten_significantly_by_paired"] == ["gate_sum 20"]
    assert c["paired"] is True
    assert paired_z(d["base_plus 16"], d["base_plus 16"]) == 0.0  # identical arrays: no z, no crash
    # without the arrays: no paired fields
    plain = check_targets(rows, None, None, top_k=8)
    assert "paired" not in plain and "paired_z" not in plain["matched_interp"][0]


def test_tokens_sidecar_round_trip_and_recheck(tmp_path, capsys):
    import json

    import torch

    from base_sglang.calibration.report import read_tokens, tokens_path, write_tokens
    from base_sglang.calibration.sweep import recheck

    rows, d = _paired_case()
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"meta": {"top_k": 8}, "rows": rows, "checks": {}}))
    assert read_tokens(path) is None
    assert write_tokens(tmp_path / "r", d) == tokens_path(path) == tmp_path / "r.tokens.safetensors"
    back = read_tokens(path)
    assert set(back) == set(d) and torch.allclose(back["oea 2"], d["oea 2"], atol=1e-6)
    recheck([str(path)])
    c = json.loads(path.read_text())["checks"]
    assert c["paired"] is True and c["beaten_significantly_by_paired"] == ["gate_sum 20"]
    tokens_path(path).unlink()  # without the arrays the paired fields go, and it says so
    recheck([str(path)])
    assert "cannot be recomputed" in capsys.readouterr().out
    assert "paired" not in json.loads(path.read_text())["checks"]


def test_merge_carries_the_arrays_when_every_file_has_them(tmp_path):
    import json

    from base_sglang.calibration.report import read_tokens, tokens_path, write_tokens
    from base_sglang.calibration.sweep import merge

    rows, d = _paired_case()
    rows[0].update(nll=2.0, tokens=4096)  # the dense row: merge checks both files score the same tokens
    meta = {"top_k": 8, "model": "m", "settings": {"batch_size": 16}}
    first = [r for r in rows if r["policy"] in ("dense", "base_plus", "oracle", "oracle_plus")]
    second = [r for r in rows if r["policy"] in ("dense", "gate_sum", "oea")]
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "m.json"
    a.write_text(json.dumps({"meta": meta, "rows": first}))
    b.write_text(json.dumps({"meta": meta, "rows": second}))
    write_tokens(a, {r["setting"]: d[r["setting"]] for r in first if r["setting"] in d})
    res = merge(str(out), [str(a), str(b)])  # b has no arrays: no paired fields, no file
    assert "paired" not in res["checks"] and not tokens_path(out).exists()
    write_tokens(b, {r["setting"]: d[r["setting"]] for r in second if r["setting"] in d})
    res = merge(str(out), [str(a), str(b)])
    assert res["checks"]["beaten_significantly_by_paired"] == ["gate_sum 20"]
    assert set(read_tokens(out)) == set(d)

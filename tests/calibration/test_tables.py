"""BENCHMARKS tables from result files: numbers come from the rows and checks, misses are marked."""

from __future__ import annotations

import json

import pytest

from base_sglang.calibration.sweep import check_targets
from base_sglang.calibration.tables import errors, main, quality, study, targets


def _row(policy, value, experts, dppl, se=0.001):
    name = f"{policy} {'M' if policy not in ('oea', 'base_plus_err') else 'x'}={value}"
    return {"setting": name, "policy": policy, "value": value, "experts": experts, "dppl_pct": dppl,
            "dnll": dppl / 100, "dnll_se": se, "ppl": 5.0 * (1 + dppl / 100), "tokens": 64,
            "agree": 0.9, "kl": 0.01}


def _result():
    rows = [_row("dense", "-", 30, 0.0),
            _row("base_plus", 4, 4, 40.0), _row("base_plus", 8, 8, 20.0), _row("base_plus", 16, 16, 5.0),
            _row("oracle", 8, 8, 19.0), _row("oracle", 16, 16, 4.0),
            _row("oracle_plus", 8, 8, 18.5), _row("oracle_plus", 16, 16, 4.8),
            _row("gate_sum", 8, 8, 30.0), _row("oea", 2, 12, 10.0), _row("oea", 3, 20, 1.0),
            _row("base_plus_err", 0.1, 12, 11.0)]
    meta = {"model": "m", "num_experts": 32, "top_k": 8, "dense_union": 30.0, "seconds": 1.0,
            "commit": "abc", "dirty": False, "torch": "t", "transformers": "5.17.0",
            "settings": {"batch_size": 8, "num_batches": 1, "prefix": 4, "steps": 8}}
    return {"meta": meta, "rows": rows, "checks": check_targets(rows, None, None, top_k=8)}


def test_quality_table_marks_ratios_and_beaters():
    text = quality(_result())
    assert "transformers 5.17.0" in text and "commit `abc`" in text
    lines = {ln.split("|")[1].strip(): ln for ln in text.splitlines() if ln.startswith("| ")}
    assert "| 1.05 ok | 1.08 ok |" in lines["8"]  # 20 / 19, 20 / 18.5
    assert "1.25 **miss**" in lines["16"] and "1.04 ok" in lines["16"]  # 5 / 4 misses, 5 / 4.8 holds
    assert "ok" not in lines["4 (< k)"] and "miss" not in lines["4 (< k)"]  # below k: not checked
    assert "| oea x=2 | 12.0 | 10.0 | 12.5 | **yes** (> 2 SE) |" in text  # halfway 20 -> 5 at cost 12
    assert "| 0.1 | 12.0 | 11.0 | 12.5 |" in text  # error-targeted row next to the fixed-M curve


def test_targets_table_states_met_or_missed_with_numbers():
    text = targets([_result()])
    row = text.splitlines()[2]
    assert "**missed**: worst 1.25x at M=16 (5.00 vs 4.00 %); over 1.1x at M = 16 (gap > 2 SE at M = 16)" in row
    assert "met: worst 1.08x at M=8 (20.0 vs 18.5 %)" in row
    assert "oea x=2 (12.0 exp.: 10.0 vs 12.5 %)" in row


def test_targets_and_quality_tables_show_the_paired_z():
    import torch

    res = _result()
    n = 256
    noise = torch.linspace(-1, 1, n, dtype=torch.float64)  # [N] shared by every setting
    tokens = {r["setting"]: r["dnll"] + noise + (0.002 if r["setting"] == "oea x=2" else 0.0) *
              torch.arange(n) / n for r in res["rows"] if r["policy"] != "dense"}
    res["checks"] = check_targets(res["rows"], None, None, top_k=8, tokens=tokens)
    row = targets([res]).splitlines()[2]
    # the 16-expert miss: a constant 0.01-nat gap, so its paired z is huge; oea's gap beats ref
    assert "(gap > 2 SE at M = 16); paired z +" in row
    z = res["checks"]["matched_interp"]
    oea = next(e for e in z if e["setting"] == "oea x=2")
    assert f"oea x=2 (12.0 exp.: 10.0 vs 12.5 %, z {oea['paired_z']:+.1f})" in row and oea["paired_z"] > 2
    assert row.endswith("| oea x=2; paired: oea x=2 |")
    assert f"| oea x=2 | 12.0 | 10.0 | 12.5 | **yes** (> 2 SE), paired z {oea['paired_z']:+.1f} |" in quality(res)


def test_study_table_and_cli(tmp_path, capsys):
    layer = {o: {"r2": r2, "spearman_cost": 0.9, "energy_pred@2": 0.8, "energy_oracle@2": 0.85}
             for o, r2 in (("linear", 0.4), ("quad16", 0.5))}
    res = {"layers": {"0": layer, "1": layer}, "cost": {"linear": {"macs_per_token": 10,
                                                                   "bytes_per_layer": 20}},
           "meta": {"model": "m", "fit_windows": 3, "heldout_windows": 1, "batch_size": 4,
                    "budgets": [2], "seconds": 1.0, "commit": "abc", "transformers": "5.17.0"}}
    text = study(res)
    assert "| linear | 0.400; 0.400-0.400 | 0.900; 0.900 | 0.8000; 0.8500 | 10 | 20 |" in text
    assert "| quad16 | 0.500;" in text and "| - | - |" in text
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_result()))
    main(["targets", str(path)])
    assert "| m | 8 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["nope", str(path)])


def test_errors_table_lists_each_bound_per_file():
    text = errors([_result(), _result()])
    assert text.splitlines()[0] == "| max_error | m B=8 | m B=8 |"
    assert "| 0.1 | 11.0 % @ 12.0 | 11.0 % @ 12.0 |" in text

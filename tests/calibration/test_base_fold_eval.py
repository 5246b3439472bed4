"""base_fold in the evaluation: sweep settings and labels, the --fold-variants parser, the fold table."""

from __future__ import annotations

import pytest

from base_sglang.calibration.sweep import (
    ALL_POLICIES,
    DEFAULT_POLICIES,
    build_settings,
    fold_label,
    parse_fold_variant,
)
from base_sglang.calibration.tables import fold


def test_settings_and_labels():
    assert "base_fold" in ALL_POLICIES and "base_fold" not in DEFAULT_POLICIES
    s = build_settings(["base_fold"], 64, 8, [8, 16],
                       fold_variants=(("native", 1.0, "drop"), ("never", 0.97, "backfill")))[1:]
    assert [x.policy for x in s] == ["base_fold"] * 2 + ["base_fold[never,0.97,backfill]"] * 2
    assert [x.budget for x in s] == [8, 16, 8, 16]
    cfg = s[2].config
    assert (cfg.policy, cfg.renorm, cfg.fold_max_loss, cfg.fold_fallback) == \
        ("base_fold", "never", 0.97, "backfill")
    assert fold_label("native", 1, "drop") == "base_fold"
    assert fold_label("partial", 1.0, "drop") == "base_fold[partial,1,drop]"


@pytest.mark.parametrize("spec, field", [("never:1", "RENORM:MAX_LOSS:FALLBACK"),
                                         ("never:x:drop", "MAX_LOSS"),
                                         ("never:0:drop", "fold_max_loss"),
                                         ("never:1:keep", "fold_fallback"),
                                         ("sometimes:1:drop", "renorm")])
def test_bad_fold_variants_name_the_field(spec, field):
    with pytest.raises(ValueError, match=field):
        parse_fold_variant(spec)


def _row(policy, value, dppl, dnll, se):
    return {"setting": f"{policy} M={value}", "policy": policy, "value": value, "experts": value - 0.5 if value != "-" else 30.0,
            "dppl_pct": dppl, "dnll": dnll, "dnll_se": se, "ppl": 5.0, "nll": 1.0, "tokens": 64}


def test_fold_table_compares_each_setting_with_base_plus():
    res = {"meta": {"model": "m", "num_experts": 32, "top_k": 4, "dense_union": 30.0, "seconds": 1.0,
                    "commit": "abc", "torch": "t", "transformers": "5.17.0",
                    "settings": {"batch_size": 8, "num_batches": 1, "prefix": 4, "steps": 8}},
           "rows": [_row("dense", "-", 0.0, 0.0, 0.0), _row("base_plus", 8, 10.0, 0.0953, 0.001),
                    _row("base_fold", 8, 8.0, 0.0770, 0.001), _row("exfold", 8, 12.0, 0.11, 0.001),
                    _row("base_plus", 16, 1.0, 0.0100, 0.004),
                    _row("base_fold", 16, 1.1, 0.0109, 0.004)]}
    text = fold(res)
    lines = [ln for ln in text.splitlines() if ln.startswith("| 8 ") or ln.startswith("| 16 ")]
    assert lines[0] == ("| 8 | 7.5 | 10.0 | 8.00 | 12.0 | - | -20.0 % * (-0.0183 ± 0.0028) |")
    assert lines[1] == ("| 16 | 15.5 | 1.00 | 1.10 | - | - | 10.0 % (+0.0009 ± 0.0113) |")


def test_foldsum_lists_lower_and_higher_budgets_and_skips_near_zero_ratios():
    from base_sglang.calibration.tables import foldsum

    res = {"meta": {"model": "m", "top_k": 4, "settings": {"batch_size": 8}},
           "rows": [_row("base_plus", 2, 50.0, 0.4, 0.001), _row("base_fold", 2, 60.0, 0.47, 0.001),
                    _row("base_plus", 8, 10.0, 0.0953, 0.001), _row("base_fold", 8, 11.0, 0.1044, 0.01),
                    _row("base_plus", 16, 1.0, 0.0100, 0.004), _row("base_fold", 16, 0.5, 0.0050, 0.004),
                    _row("base_plus", 24, 0.01, 0.0001, 0.004), _row("base_fold", 24, 0.0, 0.0, 0.004)]}
    line = foldsum([res]).splitlines()[2]
    # M=2 < k counts in the lists but not in the lowest / highest change; M=24 is below MIN_REL_PCT
    assert line == ("| m | 8 | base_fold | 16, 24 | 2*, 8 | -50.0 % at M=16 (0.50 vs 1.00 %) | "
                    "+10.0 % at M=8 (11.0 vs 10.0 %) |")

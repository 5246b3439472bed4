"""The one budget contract: parse the syntax, resolve once against E and the server's range."""

import pytest

from base_sglang.core.budget import DENSE_LABEL, budget_label, parse_budget, resolve_budget


@pytest.mark.parametrize("value,want", [(1, 1), ("8", 8), (" +12 ", 12), ("dense", 64),
                                        ("DENSE", 64), (64, 64), (4.0, 4)])
def test_valid_budgets_resolve_to_1_to_E(value, want):
    assert resolve_budget(value, "expert_budget", num_experts=64) == want
    assert budget_label(want, 64) == (DENSE_LABEL if want == 64 else want)


@pytest.mark.parametrize("value", [0, -3, "0", "lots", 2.5, True, None, "", [4], float("nan")])
def test_invalid_budgets_name_the_field(value):
    with pytest.raises(ValueError, match="^X-Expert-Budget: must be an integer"):
        parse_budget(value, "X-Expert-Budget")
    with pytest.raises(ValueError, match="^X-Expert-Budget: must be an integer"):
        resolve_budget(value, "X-Expert-Budget", 64)


def test_the_syntax_alone_does_not_know_E():
    assert parse_budget(65, "expert_budget") == 65 and parse_budget("Dense", "x") == DENSE_LABEL
    with pytest.raises(ValueError, match="expert_budget: 65 exceeds the model's 64 experts"):
        resolve_budget(65, "expert_budget", num_experts=64)


def test_the_servers_range_applies_and_dense_counts_as_E():
    assert resolve_budget(3, "b", 64, min_budget=2, max_budget=4) == 3
    for bad in (1, 5, "dense"):
        with pytest.raises(ValueError, match=r"^b: .* outside the allowed range \[2, 4\]"):
            resolve_budget(bad, "b", 64, min_budget=2, max_budget=4)


def test_error_targeted_budgets_resolve_to_cap_and_bound():
    from base_sglang.core.budget import request_budget_label, resolve_request_budget

    assert resolve_request_budget(4, "expert_budget", 64, "base_plus") == (4, None)
    assert resolve_request_budget("dense", "expert_budget", 64, "gate_sum") == (64, None)
    assert resolve_request_budget({"max_error": 0.05}, "expert_budget", 64, "base_plus") \
        == (64, 0.05)
    assert resolve_request_budget({"max_error": 0, "max_experts": 8}, "b", 64, "oracle") == (8, 0.0)
    assert resolve_request_budget({"max_error": 1}, "b", 64, "base", max_budget=16) == (16, 1.0)
    assert request_budget_label(8, 64, 0.05) == {"max_error": 0.05, "max_experts": 8}
    assert request_budget_label(64, 64) == DENSE_LABEL


@pytest.mark.parametrize("value, kw, msg", [
    ({"max_error": 2}, {}, "^b.max_error: must be a number in \\[0, 1\\]"),
    ({"max_error": float("inf")}, {}, "^b.max_error: must be a number"),
    ({"max_error": None}, {}, "^b.max_error: must be a number"),
    ({}, {}, "^b.max_error: must be a number"),
    ({"max_error": 0.1, "max_experts": "8"}, {}, "^b.max_experts: must be an integer"),
    ({"max_error": 0.1, "max_experts": 65}, {}, "^b.max_experts: 65 exceeds"),
    ({"max_error": 0.1, "max_experts": 32}, {"max_budget": 16}, "^b.max_experts: 32 is outside"),
    ({"max_error": 0.1, "M": 3}, {}, "^b: unknown key 'M'"),
    ({"max_error": 0.1}, {"policy": "oea"}, "^b.max_error: error-targeted budgets need a policy"),
    ({"max_error": 0.1}, {"min_budget": 2}, "^b.max_error: this server's minimum budget is 2"),
])
def test_bad_error_targeted_budgets_name_the_field(value, kw, msg):
    from base_sglang.core.budget import resolve_request_budget

    kw = {"policy": "base_plus", **kw}
    with pytest.raises(ValueError, match=msg):
        resolve_request_budget(value, "b", 64, kw.pop("policy"), **kw)

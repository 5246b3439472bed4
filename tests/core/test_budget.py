"""The one budget parser behind the server's header/body and the SGLang plugin."""

import pytest

from base_sglang.core.budget import DENSE, parse_budget


@pytest.mark.parametrize("value,want", [(1, 1), ("8", 8), (" +12 ", 12), ("dense", DENSE),
                                        ("DENSE", DENSE), (64, 64)])
def test_valid_budgets(value, want):
    assert parse_budget(value, "expert_budget", num_experts=64) == want


@pytest.mark.parametrize("value", [0, -3, "0", "lots", 2.5, True, None, "", [4]])
def test_invalid_budgets_name_the_field(value):
    with pytest.raises(ValueError, match="^X-Expert-Budget: must be an integer"):
        parse_budget(value, "X-Expert-Budget")


def test_budget_above_the_expert_count_is_refused_when_known():
    assert parse_budget(65, "expert_budget") == 65  # E unknown: select_experts treats >= E as dense
    with pytest.raises(ValueError, match="expert_budget: 65 exceeds the model's 64 experts"):
        parse_budget(65, "expert_budget", num_experts=64)

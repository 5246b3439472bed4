"""Per-request expert budgets: one parser for every edge (HTTP, CLI/env, in-process, SGLang hook).

A budget is the number of experts each MoE layer may execute per decode step. Clients send an
integer 1..E, its decimal string, or "dense"; `resolve_budget` turns that, once, at the edge, into
the one internal form: an int in 1..E, where E (all experts) means dense. Below the edge nothing
re-parses it. `budget_label` turns it back into what clients see ("dense" or the int).
"""

from __future__ import annotations

from typing import Any

BUDGET_HEADER = "X-Expert-Budget"
BUDGET_FIELD = "expert_budget"
DENSE_LABEL = "dense"


def parse_budget(value: Any, field: str) -> int | str:
    """The syntax alone (E unknown): an int >= 1 or DENSE_LABEL. Raises ValueError naming field."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == DENSE_LABEL:
            return DENSE_LABEL
        if text.lstrip("+").isdigit():
            value = int(text)
    if isinstance(value, float) and value.is_integer():  # JSON 4.0 is the integer 4
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field}: must be an integer number of experts (>= 1) or \"dense\", "
                         f"got {value!r}")
    return value


def resolve_budget(value: Any, field: str, num_experts: int, min_budget: int = 1,
                   max_budget: int | None = None) -> int:
    """A client's budget -> experts per MoE layer per decode step, an int in 1..E (E = dense).

    value: an int, a decimal string, or "dense" (any case). The result must also lie in
    [min_budget, max_budget] (max_budget None = E; dense counts as E). Raises ValueError whose
    message starts with `field`.
    """
    budget = parse_budget(value, field)
    if budget == DENSE_LABEL:
        budget = num_experts
    elif budget > num_experts:
        raise ValueError(f"{field}: {budget} exceeds the model's {num_experts} experts per layer "
                         f"(use {num_experts} or \"dense\")")
    hi = num_experts if max_budget is None else min(max_budget, num_experts)
    if not min_budget <= budget <= hi:
        raise ValueError(f"{field}: {budget_label(budget, num_experts)} is outside the allowed "
                         f"range [{min_budget}, {hi}] of this server (dense counts as "
                         f"{num_experts})")
    return budget


def budget_label(budget: int, num_experts: int) -> int | str:
    """What clients see: "dense" for E (or more), else the int."""
    return DENSE_LABEL if budget >= num_experts else budget

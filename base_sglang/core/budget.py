"""Per-request expert budgets as they arrive from clients: one parser for every front end.

A budget is experts per MoE layer per decode step: an integer 1..E, or "dense" (DENSE, any value >= E
means dense to select_experts). The HTTP header and the body field carry the same value.
"""

from __future__ import annotations

from typing import Any

BUDGET_HEADER = "X-Expert-Budget"
BUDGET_FIELD = "expert_budget"
DENSE = 1 << 30  # a budget >= E means dense, whatever E is


def parse_budget(value: Any, field: str, num_experts: int | None = None) -> int:
    """An integer >= 1 (<= E when E is known) or "dense" -> DENSE. Raises ValueError naming field."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "dense":
            return DENSE
        if text.lstrip("+").isdigit():
            value = int(text)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field}: must be an integer number of experts (>= 1) or \"dense\", "
                         f"got {value!r}")
    if num_experts is not None and value != DENSE and value > num_experts:
        raise ValueError(f"{field}: {value} exceeds the model's {num_experts} experts per layer "
                         f"(use {num_experts} or \"dense\")")
    return value

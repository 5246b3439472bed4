"""Per-request expert budgets: one parser for every edge (HTTP, CLI/env, in-process, SGLang hook).

A budget is the number of experts each MoE layer may execute per decode step. Clients send an
integer 1..E, its decimal string, or "dense"; `resolve_budget` turns that, once, at the edge, into
the one internal form: an int in 1..E, where E (all experts) means dense. Below the edge nothing
re-parses it. `budget_label` turns it back into what clients see ("dense" or the int).

Error-targeted budgets: a client may send {"max_error": eps, "max_experts": N} instead (eps a finite
number in [0, 1], the bound on each MoE layer's predicted relative removal error; N the cap, 1..E,
default the server's largest budget). `resolve_request_budget` resolves either form to (cap, eps or
None); the cap travels as the int budget and eps beside it (core/error_budget.py picks M per step).
"""

from __future__ import annotations

import math
from typing import Any

from .config import ERROR_POLICIES

BUDGET_HEADER = "X-Expert-Budget"
MAX_ERROR_HEADER = "X-Expert-Max-Error"  # response only: the bound of an error-targeted budget
BUDGET_FIELD = "expert_budget"
DENSE_LABEL = "dense"
BOUND_KEYS = ("max_error", "max_experts")
BOUNDED_LABEL = "max_error"  # the metrics label of every bounded request (labels stay bounded)


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


def resolve_request_budget(value: Any, field: str, num_experts: int, policy: str,
                           min_budget: int = 1, max_budget: int | None = None
                           ) -> tuple[int, float | None]:
    """A client's budget in either form -> (int budget 1..E, max_error or None).

    value: what resolve_budget takes, or {"max_error": eps, "max_experts": N} (max_experts
    optional, default min(max_budget, E)). A bound needs a policy with a removal cost
    (ERROR_POLICIES) and a server without a budget floor (min_budget 1: the bound may pick M = 1).
    Raises ValueError whose message starts with `field` (or `field.max_error` / `.max_experts`).
    """
    if not isinstance(value, dict):
        return resolve_budget(value, field, num_experts, min_budget, max_budget), None
    unknown = sorted(str(k) for k in value if k not in BOUND_KEYS)
    if unknown:
        raise ValueError(f"{field}: unknown key {unknown[0]!r} (an error-targeted budget is "
                         f"{{\"max_error\": 0..1, \"max_experts\": 1..{num_experts}}})")
    eps = value.get("max_error")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) \
            or not 0.0 <= eps <= 1.0:
        raise ValueError(f"{field}.max_error: must be a number in [0, 1] (the bound on the "
                         f"predicted relative error per MoE layer), got {eps!r}")
    if policy not in ERROR_POLICIES:
        raise ValueError(f"{field}.max_error: error-targeted budgets need a policy with a removal "
                         f"cost ({', '.join(ERROR_POLICIES)}); this server runs {policy!r}")
    if min_budget > 1:
        raise ValueError(f"{field}.max_error: this server's minimum budget is {min_budget} "
                         f"(--min-budget), which an error-targeted budget does not honour; send "
                         f"an expert count")
    hi = num_experts if max_budget is None else min(max_budget, num_experts)
    if "max_experts" not in value:
        return hi, float(eps)
    cap = value["max_experts"]
    if isinstance(cap, bool) or not isinstance(cap, int):
        raise ValueError(f"{field}.max_experts: must be an integer 1..{num_experts}, got {cap!r}")
    return resolve_budget(cap, f"{field}.max_experts", num_experts, 1, max_budget), float(eps)


def request_budget_label(budget: int, num_experts: int, max_error: float | None = None):
    """What clients see: budget_label, or {"max_error": eps, "max_experts": N} for a bound."""
    if max_error is None:
        return budget_label(budget, num_experts)
    return {"max_error": max_error, "max_experts": min(budget, num_experts)}

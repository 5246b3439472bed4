"""Per-request expert budgets: parsing, the X-Expert-Budget header, per-token budgets of a batch.

A budget is experts per MoE layer per decode step: an integer 1..E, or "dense". It travels as
    sampling_params["custom_params"]["expert_budget"]      (already an int after validation)
from the HTTP layer (body `custom_params` or the header, copied in by `apply_header`) through
SGLang's IPC to the scheduler's `Req`, and from there to one int per decode token (`token_budgets`).
"""

from __future__ import annotations

from typing import Any

BUDGET_HEADER = "X-Expert-Budget"
BUDGET_KEY = "expert_budget"
DENSE = 1 << 30  # a budget >= E is dense; same constant as base_sglang.engine.config.DENSE


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


def apply_header(sampling_params: Any, header: str | None, num_experts: int | None):
    """Validate every budget of one GenerateReqInput's sampling_params and merge the header in.

    sampling_params is None, a dict or a list of dicts (batch requests); a budget already in the
    body's custom_params wins over the header. Returns the new sampling_params (dicts are copied).
    """
    header_budget = None if header is None else parse_budget(header, BUDGET_HEADER, num_experts)
    if isinstance(sampling_params, list):
        return [_merge(p, header_budget, num_experts) for p in sampling_params]
    if sampling_params is None and header_budget is None:
        return None
    return _merge(sampling_params, header_budget, num_experts)


def _merge(params: dict | None, header_budget: int | None, num_experts: int | None) -> dict | None:
    if params is None and header_budget is None:
        return None
    params = dict(params or {})
    custom = params.get("custom_params")
    if custom is not None and not isinstance(custom, dict):
        raise ValueError(f"custom_params: must be an object, got {type(custom).__name__}")
    custom = dict(custom or {})
    if BUDGET_KEY in custom:
        custom[BUDGET_KEY] = parse_budget(custom[BUDGET_KEY], BUDGET_KEY, num_experts)
    elif header_budget is not None:
        custom[BUDGET_KEY] = header_budget
    if custom:
        params["custom_params"] = custom
    return params


def request_budget(custom_params: dict | None, default: int) -> int:
    """The budget of one scheduled request (already validated by the tokenizer-side hook)."""
    value = (custom_params or {}).get(BUDGET_KEY)
    if value is None:
        return default
    try:
        return parse_budget(value, BUDGET_KEY)
    except ValueError:  # not validated upstream (e.g. a tokenizer worker without the plugin)
        return default


def token_budgets(reqs, default: int) -> list[int]:
    """One budget per decode row of a ScheduleBatch's requests (decode: one token per request)."""
    return [request_budget(r.sampling_params.custom_params, default) for r in reqs]

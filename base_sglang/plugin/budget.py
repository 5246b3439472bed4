"""Per-request expert budgets: parsing, the X-Expert-Budget header, per-token budgets of a batch.

A budget is experts per MoE layer per decode step: an integer 1..E, or "dense". It travels as
    sampling_params["custom_params"]["expert_budget"]      (already an int after validation)
from the HTTP layer (body `custom_params` or the header, copied in by `apply_header`) through
SGLang's IPC to the scheduler's `Req`, and from there to one int per decode token (`token_budgets`).
"""

from __future__ import annotations

from typing import Any

from ..core.budget import BUDGET_FIELD as BUDGET_KEY
from ..core.budget import BUDGET_HEADER, DENSE, parse_budget

__all__ = ["BUDGET_HEADER", "BUDGET_KEY", "DENSE", "apply_header", "parse_budget", "token_budgets"]


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

"""Per-request expert budgets on the SGLang path: resolved once at the edge, read as ints after.

A budget is experts per MoE layer per decode step. The edge is the tokenizer-side hook
(TokenizerManager.generate_request, every HTTP route and Engine.generate): `apply_header` resolves
the body's `custom_params["expert_budget"]` or the X-Expert-Budget header with
core.budget.resolve_budget against the model's E, and stores the int (1..E, E = dense):
    sampling_params["custom_params"]["expert_budget"]
which crosses SGLang's IPC to the scheduler's `Req`; `token_budgets` reads one int per decode row.
"""

from __future__ import annotations

import logging
from typing import Any

from ..core.budget import BUDGET_FIELD as BUDGET_KEY
from ..core.budget import BUDGET_HEADER, resolve_budget

__all__ = ["BUDGET_HEADER", "BUDGET_KEY", "apply_header", "token_budgets"]
log = logging.getLogger("base_sglang.plugin")


def apply_header(sampling_params: Any, header: str | None, num_experts: int):
    """Resolve every budget of one GenerateReqInput's sampling_params and merge the header in.

    sampling_params is None, a dict or a list of dicts (batch requests); a budget already in the
    body's custom_params wins over the header (both are checked). Returns the new sampling_params
    (dicts are copied). Raises ValueError naming the field.
    """
    header_budget = None if header is None else resolve_budget(header, BUDGET_HEADER, num_experts)
    if isinstance(sampling_params, list):
        return [_merge(p, header_budget, num_experts) for p in sampling_params]
    if sampling_params is None and header_budget is None:
        return None
    return _merge(sampling_params, header_budget, num_experts)


def _merge(params: dict | None, header_budget: int | None, num_experts: int) -> dict | None:
    if params is None and header_budget is None:
        return None
    params = dict(params or {})
    custom = params.get("custom_params")
    if custom is not None and not isinstance(custom, dict):
        raise ValueError(f"custom_params: must be an object, got {type(custom).__name__}")
    custom = dict(custom or {})
    if BUDGET_KEY in custom:
        custom[BUDGET_KEY] = resolve_budget(custom[BUDGET_KEY], BUDGET_KEY, num_experts)
    elif header_budget is not None:
        custom[BUDGET_KEY] = header_budget
    if custom:
        params["custom_params"] = custom
    return params


def token_budgets(reqs, default: int, num_experts: int) -> list[int]:
    """One budget per decode row of a ScheduleBatch's requests (decode: one token per request).

    The values were resolved at the edge; one that is not an int in 1..E can only come from a
    path around the tokenizer hook: it is logged and the request runs at the default budget.
    """
    out = []
    for r in reqs:
        value = (r.sampling_params.custom_params or {}).get(BUDGET_KEY, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= num_experts:
            log.warning("BASE: request %s carries expert_budget %r, not resolved at the tokenizer "
                        "hook; it runs at the default budget %d", getattr(r, "rid", "?"), value,
                        default)
            value = default
        out.append(value)
    return out

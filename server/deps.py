"""Request dependencies: the expert budget (header or body), the API key, app-state accessors."""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import Request

from base_sglang.core.budget import (
    BUDGET_FIELD,
    BUDGET_HEADER,
    budget_label,
    resolve_request_budget,
)
from base_sglang.core.budget import resolve_budget as resolve
from base_sglang.server.errors import APIError

__all__ = ["BUDGET_HEADER", "budget_label", "check_model", "require_api_key", "resolve_budget"]


def resolve_budget(request: Request, body_value: Any) -> tuple[int, float | None]:
    """The request's budget: (an int in 1..E, E = dense; max_error or None). The body field
    (an expert count, or {"max_error": .., "max_experts": ..}) wins over the header (an expert
    count only; a malformed header is refused even then); absent -> the server default. Raises
    APIError(400) naming the field."""
    settings, backend = request.app.state.settings, request.app.state.backend
    found = [(BUDGET_FIELD, body_value), (BUDGET_HEADER, request.headers.get(BUDGET_HEADER))]
    found = [(field, value) for field, value in found if value is not None]
    budgets = []
    for field, value in found:  # both are checked when both are sent; the body's wins
        try:
            if field == BUDGET_FIELD:
                budgets.append(resolve_request_budget(value, field, backend.num_experts,
                                                      backend.policy, settings.min_budget,
                                                      settings.max_budget))
            else:
                budgets.append((resolve(value, field, backend.num_experts, settings.min_budget,
                                        settings.max_budget), None))
        except ValueError as exc:
            raise APIError.from_value_error(exc) from None
    return budgets[0] if budgets else (request.app.state.default_budget, None)


async def require_api_key(request: Request) -> None:
    key = request.app.state.settings.api_key
    if not key:
        return
    auth = request.headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), key):
        raise APIError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                       code="invalid_api_key")


def check_model(request: Request, model: str) -> None:
    name = request.app.state.backend.name
    if model != name:
        raise APIError(404, f"model: {model!r} does not exist; this server serves {name!r}",
                       param="model", code="model_not_found")

"""Request dependencies: the expert budget (header or body), the API key, app-state accessors."""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import Request

from base_sglang.core.budget import BUDGET_FIELD, BUDGET_HEADER, budget_label
from base_sglang.core.budget import resolve_budget as resolve
from base_sglang.server.errors import APIError

__all__ = ["BUDGET_HEADER", "budget_label", "check_model", "require_api_key", "resolve_budget"]


def resolve_budget(request: Request, body_value: Any) -> int:
    """The request's budget, an int in 1..E (E = dense): the body field wins over the header
    (a malformed header is refused even then); absent -> the server default. Raises
    APIError(400) naming the field."""
    settings, backend = request.app.state.settings, request.app.state.backend
    found = [(BUDGET_FIELD, body_value), (BUDGET_HEADER, request.headers.get(BUDGET_HEADER))]
    found = [(field, value) for field, value in found if value is not None]
    budgets = []
    for field, value in found:  # both are checked when both are sent; the body's wins
        try:
            budgets.append(resolve(value, field, backend.num_experts, settings.min_budget,
                                   settings.max_budget))
        except ValueError as exc:
            raise APIError(400, str(exc), param=field) from None
    return budgets[0] if budgets else request.app.state.default_budget


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

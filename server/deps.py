"""Request dependencies: the expert budget (header or body), the API key, app-state accessors."""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import Request

from base_sglang.core import budget as core_budget
from base_sglang.core.budget import BUDGET_FIELD, BUDGET_HEADER, DENSE
from base_sglang.server.errors import APIError


def parse_budget(value: Any, field: str) -> int:
    """An integer >= 1, or "dense" (-> DENSE). Raises APIError(400) naming the field."""
    try:
        return core_budget.parse_budget(value, field)
    except ValueError as exc:
        raise APIError(400, str(exc), param=field) from None


def resolve_budget(request: Request, body_value: Any) -> int:
    """The request's budget: body field wins over the header; absent -> the server default."""
    settings, backend = request.app.state.settings, request.app.state.backend
    E = backend.num_experts
    if body_value is not None:
        field, budget = BUDGET_FIELD, parse_budget(body_value, BUDGET_FIELD)
    elif request.headers.get(BUDGET_HEADER) is not None:
        field, budget = BUDGET_HEADER, parse_budget(request.headers[BUDGET_HEADER], BUDGET_HEADER)
    else:
        return request.app.state.default_budget
    if budget != DENSE and budget > E:
        raise APIError(400, f"{field}: {budget} exceeds the model's {E} experts per layer "
                            f"(use {E} or \"dense\")", param=field)
    lo, hi = settings.min_budget, settings.max_budget or E
    effective = min(budget, E)
    if not lo <= effective <= hi:
        raise APIError(400, f"{field}: {budget_label(budget, E)} is outside the allowed range "
                            f"[{lo}, {hi}] of this server", param=field)
    return budget


def budget_label(budget: int, num_experts: int) -> int | str:
    return "dense" if budget >= num_experts else budget


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

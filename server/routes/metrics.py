"""GET /metrics: Prometheus text (requests, tokens, latency, batch size, experts, budgets)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

router = APIRouter()


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> PlainTextResponse:
    text = request.app.state.metrics.render(request.app.state.backend.stats())
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

"""GET /health: 200 once the engine loop runs (no API key, for probes)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    stats = request.app.state.backend.stats()
    return JSONResponse({"status": "ok", "model": request.app.state.backend.name,
                         "running": stats.get("num_requests_running", 0),
                         "waiting": stats.get("num_requests_waiting", 0)})

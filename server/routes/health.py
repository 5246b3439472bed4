"""GET /health: 200 while serving, 503 while draining for shutdown (no API key, for probes)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    stats = request.app.state.backend.stats()
    draining = request.app.state.draining.is_set()
    return JSONResponse({"status": "draining" if draining else "ok",
                         "model": request.app.state.backend.name,
                         "running": stats.get("num_requests_running", 0),
                         "waiting": stats.get("num_requests_waiting", 0)},
                        status_code=503 if draining else 200)

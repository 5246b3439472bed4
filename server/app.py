"""create_app(backend, settings): the FastAPI app; its lifespan starts and stops the backend."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from base_sglang.core.budget import resolve_budget
from base_sglang.server.errors import install_error_handlers
from base_sglang.server.metrics import Metrics
from base_sglang.server.routes import chat, completions, health, metrics, models
from base_sglang.server.settings import Settings


def create_app(backend, settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await backend.start()
        try:
            yield
        finally:
            await backend.stop()

    app = FastAPI(title="base-sglang", version="0.1.0", lifespan=lifespan)
    app.state.backend = backend
    app.state.settings = settings
    app.state.metrics = Metrics()
    app.state.default_budget = _default_budget(settings, backend.num_experts)
    install_error_handlers(app)
    for module in (models, completions, chat, health, metrics):
        app.include_router(module.router)
    return app


def _default_budget(settings: Settings, num_experts: int) -> int:
    lo, hi = settings.min_budget, settings.max_budget or num_experts
    if not 1 <= lo <= hi:
        raise ValueError(f"min_budget/max_budget: need 1 <= min_budget <= max_budget, got "
                         f"[{lo}, {hi}]")
    return resolve_budget(settings.default_budget, "default_budget", num_experts, lo, hi)

"""create_app(backend, settings): the FastAPI app; its lifespan starts and stops the backend."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI

from base_sglang.core.budget import resolve_budget
from base_sglang.engine.tool_calls import supports_tools
from base_sglang.server.errors import install_error_handlers
from base_sglang.server.limits import BodyLimit, Limits, longest_token_chars
from base_sglang.server.metrics import Metrics
from base_sglang.server.routes import (
    chat,
    completions,
    generate,
    health,
    metrics,
    models,
    tokenize,
)
from base_sglang.server.settings import Settings

log = logging.getLogger("base_sglang.server")


def create_app(backend, settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.loop = asyncio.get_running_loop()
        await backend.start()
        info = backend.describe()
        log.info("base-serve: serving %s", ", ".join(f"{k}={v}" for k, v in info.items()))
        log.info("base-serve: limits: request body %d bytes, %d tokens per request, budgets "
                 "[%d, %s], shutdown timeout %g s", app.state.limits.max_request_bytes,
                 app.state.limits.max_model_len, settings.min_budget,
                 settings.max_budget or backend.num_experts, settings.shutdown_timeout)
        try:
            yield
        finally:
            await backend.stop()

    app = FastAPI(title="base-sglang", version="0.1.0", lifespan=lifespan)
    app.state.backend = backend
    app.state.settings = settings
    app.state.metrics = Metrics()
    app.state.loop = None  # the serving event loop (the shutdown deadline schedules onto it)
    app.state.default_budget = _default_budget(settings, backend.num_experts)
    app.state.limits = Limits(settings.max_request_bytes, backend.max_model_len,
                              longest_token_chars(backend.tokenizer))
    app.state.supports_tools = supports_tools(backend.tokenizer)  # chat template renders tools
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    for module in (models, completions, chat, tokenize, generate, health, metrics):
        app.include_router(module.router)
    app.openapi = lambda: _openapi(app)
    return app


def _default_budget(settings: Settings, num_experts: int) -> int:
    lo, hi = settings.min_budget, settings.max_budget or num_experts
    if not 1 <= lo <= hi:
        raise ValueError(f"min_budget/max_budget: need 1 <= min_budget <= max_budget, got "
                         f"[{lo}, {hi}]")
    return resolve_budget(settings.default_budget, "default_budget", num_experts, lo, hi)


def budget_pattern(lo: int, hi: int) -> str:
    """A regex of exactly the budget strings this server accepts: dense (any case), lo..hi."""
    nums = "|".join(str(n) for n in range(lo, hi + 1))
    return f"^\\s*([Dd][Ee][Nn][Ss][Ee]|[+]?0*({nums}))\\s*$"


def _openapi(app: FastAPI) -> dict:
    """FastAPI's schema, minus the 422 it adds to every route (this server answers 400), with
    what this server accepts filled in: the served model id as the only value of `model`, the
    budget range of this model and server, max_tokens up to the context length."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for op in path.values():
                op.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        backend, settings = app.state.backend, app.state.settings
        lo, hi = settings.min_budget, settings.max_budget or backend.num_experts
        pattern = budget_pattern(lo, hi)
        for name in ("CompletionRequest", "ChatCompletionRequest"):
            props = schema["components"]["schemas"][name]["properties"]
            props["model"] = {**props["model"], "enum": [backend.name]}
            _budget_schema(props["expert_budget"], lo, hi, backend.num_experts, pattern)
            for field in ("max_tokens", "max_completion_tokens"):
                if field in props:
                    for option in props[field].get("anyOf", [props[field]]):
                        if option.get("type") == "integer":
                            option["maximum"] = backend.max_model_len - 1
        components = schema["components"]["schemas"]
        for name in ("TokenizeRequest", "DetokenizeRequest"):
            for option in components[name]["properties"]["model"].get("anyOf", []):
                if option.get("type") == "string":
                    option["enum"] = [backend.name]
        sampling = components["GenerateSamplingParams"]["properties"]
        for option in sampling["max_new_tokens"].get("anyOf", []):
            if option.get("type") == "integer":
                option["maximum"] = backend.max_model_len - 1
        _budget_schema(components["CustomParams"]["properties"]["expert_budget"], lo, hi,
                       backend.num_experts, pattern)
        for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
            for param in schema["paths"][path]["post"].get("parameters", []):
                if param["name"] == "X-Expert-Budget":
                    param["schema"]["pattern"] = pattern
        app.openapi_schema = schema
    return app.openapi_schema


def _budget_schema(prop: dict, lo: int, hi: int, num_experts: int, pattern: str) -> None:
    """The budget field's schema for this server: integers lo..min(hi, E), the strings of them,
    and "dense" where the range reaches E; the error-targeted object's cap up to min(hi, E)."""
    number, text, *rest = prop["anyOf"]  # [..., the error-targeted object (requests), null]
    number.update(minimum=lo, maximum=min(hi, num_experts))
    text["pattern"] = pattern if hi >= num_experts else pattern.replace("[Dd][Ee][Nn][Ss][Ee]|", "")
    for bound in rest[:-1]:
        bound["properties"]["max_experts"].update(maximum=min(hi, num_experts))

"""Serving backends: the small interface the HTTP layer needs from an engine.

A backend is any object with these members (`Backend` below spells them out):

  name           str   model id served at /v1/models and checked against each request's `model`
  num_experts    int   E, routed experts per MoE layer: budgets are 1..E, E (or more) = dense
  max_model_len  int   prompt + output tokens per request
  policy         str   the selection policy in decode steps
  tokenizer            a transformers tokenizer (encode / decode / apply_chat_template)
  async start(), async stop()      called by the app's lifespan
  generate(prompt_ids, params, budget, request_id) -> AsyncIterator[RequestOutput]
        params is engine.SamplingParams, budget an int (>= E: dense) or None (backend default);
        yields engine.RequestOutput deltas until one has finished=True. Raises ValueError
        ("field: message", -> HTTP 400 naming the field) or engine.QueueFull (-> 503) before the
        first output. Leaving the iterator early (client gone) must abort the request and free its
        batch slot. A failed request ends with finish_reason "error" and `error` set.
  abort(request_id)    drop a submitted request (also one whose stream was never iterated)
  stats() -> dict      {"num_requests_running": int, "num_requests_waiting": int,
                        "engine": engine.stats.EngineStats | None}  (read by /metrics)

A new backend (e.g. `sglang`, from the plugin) is a module with `create_backend(settings)` returning
such an object, registered by name in BACKENDS. `settings` is server.settings.Settings; the CLI
arguments base-serve does not know arrive in `settings.backend_args` (a list of strings) for the
backend to parse (e.g. SGLang's --tp-size). create_backend raises FileNotFoundError or ValueError
with a message naming the option for bad settings (base-serve prints it and exits 1).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib import import_module
from typing import Any, Protocol

BACKENDS = {
    "native": "base_sglang.server.backends.native",
    "sglang": "base_sglang.server.backends.sglang",
}


class Backend(Protocol):
    name: str
    num_experts: int
    max_model_len: int
    policy: str
    tokenizer: Any

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def generate(self, prompt_ids: list[int], params, budget: int | None,
                 request_id: str) -> AsyncIterator: ...
    def abort(self, request_id: str) -> None: ...
    def stats(self) -> dict: ...


def create_backend(settings) -> Backend:
    """Build the backend named by settings.backend (imported lazily)."""
    if settings.backend not in BACKENDS:
        raise ValueError(f"backend: unknown {settings.backend!r}; choose one of {sorted(BACKENDS)}")
    try:
        module = import_module(BACKENDS[settings.backend])
    except ModuleNotFoundError as exc:
        raise ValueError(f"backend: {settings.backend!r} is not available here ({exc})") from exc
    return module.create_backend(settings)

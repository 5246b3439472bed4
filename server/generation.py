"""What the completion and chat routes share: submit prompts, collect or merge their streams."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request

from base_sglang.protocol import QueueFull, RequestOutput, SamplingParams
from base_sglang.server.deps import budget_label
from base_sglang.server.errors import APIError


@dataclass
class Result:
    """One choice's outputs folded together."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    prompt_logprobs: list | None = None
    last: RequestOutput | None = None

    def add(self, out: RequestOutput) -> None:
        self.text += out.text
        self.token_ids += out.token_ids
        self.logprobs += out.logprobs or []
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        self.last = out


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sampling_params(body, max_tokens: int, logprobs: int | None,
                    prompt_logprobs: int | None) -> SamplingParams:
    stop = body.stop if isinstance(body.stop, list) else ([body.stop] if body.stop else [])
    if body.n != 1:
        raise APIError(400, f"n: only n=1 is supported, got {body.n}", param="n")
    try:
        return SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=-1 if body.top_k is None else body.top_k, max_tokens=max_tokens,
            stop=tuple(stop), seed=body.seed, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            ignore_eos=body.ignore_eos)
    except ValueError as exc:
        raise APIError.from_value_error(exc) from exc


def submit(backend, prompts: list[list[int]], params: SamplingParams, budget: int,
           base_id: str) -> list[AsyncIterator[RequestOutput]]:
    """Submit every prompt; on a refusal abort the ones already in and raise APIError."""
    streams, ids = [], []
    try:
        for i, prompt_ids in enumerate(prompts):
            rid = f"{base_id}-{i}"
            streams.append(backend.generate(prompt_ids, params, budget, rid))
            ids.append(rid)
    except (ValueError, QueueFull) as exc:
        for rid in ids:
            backend.abort(rid)
        if isinstance(exc, QueueFull):
            raise APIError(503, f"server busy: {exc}", code="queue_full") from exc
        raise APIError.from_value_error(exc) from exc
    return streams


async def collect(request: Request, streams) -> list[Result]:
    """Drain every stream; a client that goes away cancels them (which aborts the requests)."""

    async def drain(stream) -> Result:
        res = Result()
        async for out in stream:
            res.add(out)
        return res

    task = asyncio.ensure_future(asyncio.gather(*(drain(s) for s in streams)))
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.25)
        if done:
            try:
                results = task.result()
            except QueueFull as exc:  # refused by the engine thread after submit (a race)
                raise APIError(503, f"server busy: {exc}", code="queue_full") from exc
            except ValueError as exc:
                raise APIError.from_value_error(exc) from exc
            for res in results:
                raise_if_failed(res.last)
            return results
        if await request.is_disconnected():
            task.cancel()  # cancels every drain: their streams abort their requests
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise APIError(499, "client closed the request", code="client_disconnected")


def raise_if_failed(out: RequestOutput | None) -> None:
    if out is not None and out.error is not None:
        raise APIError(500, f"the request failed inside the engine: {out.error}", code="engine_error")


def error_event(exc: Exception) -> str:
    """An SSE error event for a stream that already sent its 200 headers."""
    status = 503 if isinstance(exc, QueueFull) else 400
    err = APIError(status, str(exc)) if status == 503 else APIError.from_value_error(exc)
    return sse({"error": {"message": err.message, "type": "invalid_request_error",
                          "param": err.param, "code": "queue_full" if status == 503 else None}})


def engine_error_event(error: str) -> str:
    """An SSE error event for a request that failed inside the engine mid-stream."""
    return sse({"error": {"message": f"the request failed inside the engine: {error}",
                          "type": "internal_server_error", "param": None, "code": "engine_error"}})


async def sse_stream(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """A route's SSE body: its events, a late refusal as an error event, then [DONE]."""
    try:
        async for event in events:
            yield event
    except (ValueError, QueueFull) as exc:
        yield error_event(exc)
    yield sse("[DONE]")


async def merge(streams) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several output streams as (choice index, output), in arrival order."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i, stream):
        async for out in stream:
            await q.put((i, out))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    left = len(streams)
    try:
        while left:
            i, out = await q.get()
            left -= out.finished
            yield i, out
    finally:
        for t in tasks:
            t.cancel()


def usage(results: list[Result], budget: int, num_experts: int) -> dict:
    prompt = sum(r.last.num_prompt_tokens for r in results if r.last)
    completion = sum(r.last.num_output_tokens for r in results if r.last)
    executed = [r.last.experts_per_layer for r in results if r.last and r.last.experts_per_layer]
    routed = [r.last.experts_per_layer_routed for r in results
              if r.last and r.last.experts_per_layer_routed]
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "expert_budget": budget_label(budget, num_experts),
            "experts_per_layer": sum(executed) / len(executed) if executed else None,
            "experts_per_layer_dense": sum(routed) / len(routed) if routed else None}


def record(request: Request, endpoint: str, status: int, results: list[Result], budget: int,
           started: float) -> None:
    metrics, backend = request.app.state.metrics, request.app.state.backend
    metrics.observe_request(endpoint, status)
    u = usage(results, budget, backend.num_experts)
    reason = results[0].last.finish_reason if results and results[0].last else None
    metrics.observe_result(u["expert_budget"], u["prompt_tokens"], u["completion_tokens"],
                           time.monotonic() - started, reason)


def sse(payload) -> str:
    """One server-sent event; payload is a pydantic model, a dict, or already-encoded text."""
    if isinstance(payload, dict):
        payload = json.dumps(payload)
    elif not isinstance(payload, str):
        payload = payload.model_dump_json()
    return f"data: {payload}\n\n"

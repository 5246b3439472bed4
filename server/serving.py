"""What every generation route does, once: check, budget, tokenize off the event loop, submit to
the backend, then collect or stream the outputs, with exactly one accounting of each request.

A route supplies its prompts (token ids, built by `encode` / in a worker thread) and how to render
outputs; `start` returns a Job whose streams are already submitted (refusals raise APIError before
any response starts), `collect` drains it for a JSON answer, `stream` frames it as SSE.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import Request

from base_sglang.core.budget import BUDGET_HEADER, budget_label
from base_sglang.protocol import SHUTTING_DOWN, QueueFull, RequestOutput, SamplingParams
from base_sglang.server.deps import check_model, resolve_budget
from base_sglang.server.errors import APIError, error_body


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


@dataclass
class Job:
    """One admitted HTTP request: its settings, its submitted streams, and their accounting."""

    request: Request
    endpoint: str  # "completions" | "chat"
    rid: str
    budget: int  # 1..E (E = dense)
    prompts: list[list[int]]
    params: SamplingParams
    started: float
    streams: list = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    created: int = field(default_factory=lambda: int(time.time()))
    _last_token_at: list[float | None] = field(default_factory=list)
    _done: bool = False

    @property
    def backend(self):
        return self.request.app.state.backend

    @property
    def label(self) -> int | str:
        return budget_label(self.budget, self.backend.num_experts)

    @property
    def headers(self) -> dict[str, str]:
        return {BUDGET_HEADER: str(self.label)}

    def observe(self, i: int, out: RequestOutput) -> None:
        """Fold one output into choice i and the latency histograms."""
        first = self.results[i].last is None
        self.results[i].add(out)
        metrics, now = self.request.app.state.metrics, time.monotonic()
        if first and out.queue_time_s is not None:
            metrics.queue.observe(out.queue_time_s)
        if out.token_ids:
            last = self._last_token_at[i]
            if last is None:
                metrics.ttft.observe(now - self.started)
            else:
                metrics.itl.observe((now - last) / len(out.token_ids), len(out.token_ids))
            self._last_token_at[i] = now

    def finish(self, reason: str | None = None) -> None:
        """Account the request once: its reason (error > abort > choice 0's), tokens, latency."""
        if self._done:
            return
        self._done = True
        lasts = [r.last for r in self.results]
        if reason is None:
            if any(x is None or x.error is not None for x in lasts):
                reason = "error"
            elif any(x.finish_reason == "abort" for x in lasts):
                reason = "abort"
            else:
                reason = lasts[0].finish_reason
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(len(r.token_ids) for r in self.results)
        self.request.app.state.metrics.observe_finish(reason, self.label, prompt, completion,
                                                      time.monotonic() - self.started)

    def usage(self, results: list[Result] | None = None) -> dict:
        results = self.results if results is None else results
        prompt = sum(r.last.num_prompt_tokens for r in results if r.last)
        completion = sum(r.last.num_output_tokens for r in results if r.last)
        executed = [r.last.experts_per_layer for r in results if r.last and r.last.experts_per_layer]
        routed = [r.last.experts_per_layer_routed for r in results
                  if r.last and r.last.experts_per_layer_routed]
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion, "expert_budget": self.label,
                "experts_per_layer": sum(executed) / len(executed) if executed else None,
                "experts_per_layer_dense": sum(routed) / len(routed) if routed else None}


# ---- prompts --------------------------------------------------------------------------------------
async def encode(request: Request, text: str, field_name: str,
                 add_special_tokens: bool = True) -> list[int]:
    """Token ids of a prompt text, tokenised in a worker thread. A text too long to fit the model
    by any tokenisation (more characters than max_model_len tokens can hold) is refused at once."""
    limits = request.app.state.limits
    if len(text) > limits.max_prompt_chars:
        raise APIError(400, f"{field_name}: {len(text)} characters cannot fit this model's "
                            f"{limits.max_model_len} tokens (--max-model-len)", param=field_name)
    tokenizer = request.app.state.backend.tokenizer
    return await asyncio.to_thread(tokenizer.encode, text, add_special_tokens=add_special_tokens)


def check_ids(ids: list[int], field_name: str, max_model_len: int) -> list[int]:
    if not ids:
        raise APIError(400, f"{field_name}: must contain at least one token", param=field_name)
    if len(ids) >= max_model_len:
        raise APIError(400, f"{field_name}: {len(ids)} tokens leave no room in this model's "
                            f"{max_model_len} (--max-model-len)", param=field_name)
    return ids


# ---- submit, collect, stream --------------------------------------------------------------------
async def start(request: Request, body, endpoint: str, prompts: Callable, params: Callable) -> Job:
    """Check the request and submit it; raises APIError (4xx/503) before any response begins.

    prompts: async () -> list of token-id lists; params: (prompt ids) -> SamplingParams.
    """
    started = time.monotonic()
    backend = request.app.state.backend
    check_model(request, body.model)
    budget = resolve_budget(request, body.expert_budget)
    ids = await prompts()
    limits = request.app.state.limits
    ids = [check_ids(p, "prompt" if endpoint == "completions" else "messages", limits.max_model_len)
           for p in ids]
    if backend.capacity is not None and len(ids) > backend.capacity:
        raise APIError(400, f"prompt: {len(ids)} prompts in one request exceed this server's "
                            f"capacity of {backend.capacity} requests (--max-running-requests + "
                            f"--max-waiting-requests)", param="prompt", code="too_many_prompts")
    try:
        sp = params(ids)
    except ValueError as exc:
        raise APIError.from_value_error(exc) from exc
    job = Job(request, endpoint, f"{'cmpl' if endpoint == 'completions' else 'chatcmpl'}-"
                                 f"{uuid.uuid4().hex}", budget, ids, sp, started)
    job.results = [Result() for _ in ids]
    job._last_token_at = [None] * len(ids)
    submitted = []
    try:
        for i, p in enumerate(ids):
            job.streams.append(backend.generate(p, sp, budget, f"{job.rid}-{i}"))
            submitted.append(f"{job.rid}-{i}")
    except (ValueError, QueueFull) as exc:
        for rid in submitted:
            backend.abort(rid)
        if isinstance(exc, QueueFull):
            raise APIError(503, f"server busy: {exc}", code="queue_full") from exc
        raise APIError.from_value_error(exc) from exc
    return job


async def collect(job: Job) -> list[Result]:
    """Drain every stream; a client that goes away cancels them (which aborts the requests)."""

    async def drain(i, stream):
        async for out in stream:
            job.observe(i, out)

    task = asyncio.ensure_future(asyncio.gather(*(drain(i, s) for i, s in enumerate(job.streams))))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                task.result()
                break
            if await job.request.is_disconnected():
                task.cancel()  # cancels every drain: their streams abort their requests
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                job.finish("abort")
                raise APIError(499, "client closed the request", code="client_disconnected")
    except (ValueError, QueueFull) as exc:  # refused by the engine thread after submit (a race)
        job.finish("error")
        if isinstance(exc, QueueFull):
            raise APIError(503, f"server busy: {exc}", code="queue_full") from exc
        raise APIError.from_value_error(exc) from exc
    job.finish()
    for res in job.results:
        raise_if_failed(res.last)
    return job.results


def raise_if_failed(out: RequestOutput | None) -> None:
    if out is None or out.error is None:
        return
    if out.error == SHUTTING_DOWN:
        raise APIError(503, SHUTTING_DOWN, code="shutting_down")
    raise APIError(500, f"the request failed inside the engine: {out.error}", code="engine_error")


async def merged(job: Job) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave the job's streams as (choice index, output), in arrival order."""
    if len(job.streams) == 1:
        async for out in job.streams[0]:
            job.observe(0, out)
            yield 0, out
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i, stream):
        async for out in stream:
            await q.put((i, out))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(job.streams)]
    left = len(job.streams)
    try:
        while left:
            i, out = await q.get()
            left -= out.finished
            job.observe(i, out)
            yield i, out
    finally:
        for t in tasks:
            t.cancel()


async def sse_frames(job: Job, events: AsyncIterator[str]) -> AsyncIterator[str]:
    """A route's SSE body: its events, an error event where the request fails, then [DONE].
    Whatever ends the stream (done, error, client gone) accounts the request once."""
    try:
        async for event in events:
            yield event
    except (ValueError, QueueFull) as exc:  # refused by the engine thread after submit
        job.finish("error")
        yield error_event(exc)
    finally:  # also on a client that went away (cancellation, GeneratorExit)
        if not job._done:
            done = all(r.last is not None and r.last.finished for r in job.results)
            job.finish(None if done else "abort")
    yield sse("[DONE]")


def error_event(exc: Exception) -> str:
    """An SSE error event for a refusal that came after the 200 headers were sent."""
    if isinstance(exc, QueueFull):
        return sse(error_body(503, f"server busy: {exc}", None, "queue_full"))
    err = APIError.from_value_error(exc)
    return sse(error_body(400, err.message, err.param))


def failure_event(out: RequestOutput) -> str:
    """An SSE error event for a request that failed inside the backend mid-stream."""
    if out.error == SHUTTING_DOWN:
        return sse(error_body(503, SHUTTING_DOWN, None, "shutting_down"))
    return sse(error_body(500, f"the request failed inside the engine: {out.error}", None,
                          "engine_error"))


def sse(payload) -> str:
    """One server-sent event; payload is a pydantic model, a dict, or already-encoded text."""
    if isinstance(payload, dict):
        payload = json.dumps(payload)
    elif not isinstance(payload, str):
        payload = payload.model_dump_json()
    return f"data: {payload}\n\n"


def sampling_params(body, max_tokens: int, logprobs: int | None,
                    prompt_logprobs: int | None) -> SamplingParams:
    """The request body's sampling fields -> SamplingParams (ValueError names the field)."""
    stop = body.stop if isinstance(body.stop, list) else ([body.stop] if body.stop else [])
    return SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=-1 if body.top_k is None else body.top_k, max_tokens=max_tokens,
        stop=tuple(stop), seed=body.seed, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
        ignore_eos=body.ignore_eos)

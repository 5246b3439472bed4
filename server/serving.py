"""What every generation route does, once: check, budget, tokenize off the event loop, submit to
the backend, then collect or stream the outputs, with exactly one accounting of each request.

A route supplies its prompts (token ids, built by `encode` / in a worker thread) and how to render
outputs; `start` returns a Job whose streams are already submitted (refusals raise APIError before
any response starts), `collect` drains it for a JSON answer, `sse_frames` frames it as SSE.

Choices: each prompt is one backend request with params.n choices (they share its prefill); choice
j of prompt p is the response's choice p * n + j, as OpenAI and vLLM number them.
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

from base_sglang.core.budget import (
    BOUNDED_LABEL,
    BUDGET_HEADER,
    MAX_ERROR_HEADER,
    request_budget_label,
)
from base_sglang.protocol import (
    SHUTTING_DOWN,
    QueueFull,
    RequestOutput,
    ResponseFormat,
    SamplingParams,
)
from base_sglang.server.deps import check_model, resolve_budget
from base_sglang.server.errors import APIError, error_body, field_of


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
    budget: int  # 1..E (E = dense); with max_error, the cap
    prompts: list[list[int]]
    params: SamplingParams
    started: float
    max_error: float | None = None  # error-targeted budget (core.error_budget), or None
    streams: list = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    created: int = field(default_factory=lambda: int(time.time()))
    _last_token_at: list[float | None] = field(default_factory=list)  # per choice
    _first_token_seen: list[bool] = field(default_factory=list)  # per prompt
    _done: bool = False

    @property
    def n(self) -> int:
        return self.params.n

    @property
    def backend(self):
        return self.request.app.state.backend

    @property
    def label(self) -> int | str | dict:
        """The applied budget as clients see it: "dense", the int, or the bound with its cap."""
        return request_budget_label(self.budget, self.backend.num_experts, self.max_error)

    @property
    def metrics_label(self) -> int | str:
        return BOUNDED_LABEL if self.max_error is not None else self.label

    @property
    def headers(self) -> dict[str, str]:
        """The applied budget (a bounded request: its cap, and the bound in its own header)."""
        if self.max_error is None:
            return {BUDGET_HEADER: str(self.label)}
        cap = request_budget_label(self.budget, self.backend.num_experts)
        return {BUDGET_HEADER: str(cap), MAX_ERROR_HEADER: repr(self.max_error)}

    def observe(self, p: int, out: RequestOutput) -> int:
        """Fold one output of prompt p into its choice and the latency histograms (time to first
        token and queue time once per prompt, inter-token latency per choice); -> the choice."""
        i = p * self.n + out.index
        first_output = all(self.results[p * self.n + j].last is None for j in range(self.n))
        self.results[i].add(out)
        metrics, now = self.request.app.state.metrics, time.monotonic()
        if first_output and out.queue_time_s is not None:
            metrics.queue.observe(out.queue_time_s)
        if out.token_ids:
            last = self._last_token_at[i]
            if not self._first_token_seen[p]:
                metrics.ttft.observe(now - self.started)
                self._first_token_seen[p] = True
            elif last is not None:
                metrics.itl.observe((now - last) / len(out.token_ids), len(out.token_ids))
            self._last_token_at[i] = now
        return i

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
        self.request.app.state.metrics.observe_finish(reason, self.metrics_label, prompt,
                                                      completion, time.monotonic() - self.started)

    def usage(self) -> dict:
        """OpenAI's usage: each prompt counted once, the tokens of every returned choice."""
        results = self.results
        firsts = [results[p * self.n].last for p in range(len(self.prompts))]
        prompt = sum(x.num_prompt_tokens for x in firsts if x)
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
PROMPT_FIELDS = {"completions": "prompt", "chat": "messages", "generate": "text"}


async def start(request: Request, body, endpoint: str, prompts: Callable, params: Callable,
                rename: Callable[[str], str] = lambda msg: msg) -> Job:
    """Check the request and submit it; raises APIError (4xx/503) before any response begins.

    prompts: async () -> list of token-id lists; params: (prompt ids) -> SamplingParams;
    rename: maps an error message onto the request field it came from (a tool constraint's
    grammar names `tools`; /generate names SGLang's fields).
    """
    started = time.monotonic()
    backend = request.app.state.backend
    if endpoint != "generate":  # SGLang's /generate has no model field (a router's is ignored)
        check_model(request, body.model)
    budget, max_error = resolve_budget(request, body.expert_budget)
    ids = await prompts()
    limits = request.app.state.limits
    field_name = PROMPT_FIELDS[endpoint]
    ids = [check_ids(p, field_name, limits.max_model_len) for p in ids]
    if backend.capacity is not None and len(ids) > backend.capacity:
        raise APIError(400, f"{field_name}: {len(ids)} prompts in one request exceed this "
                            f"server's capacity of {backend.capacity} requests "
                            f"(--max-running-requests + --max-waiting-requests)",
                       param=field_name, code="too_many_prompts")
    try:
        sp = params(ids)
    except ValueError as exc:
        raise APIError.from_value_error(ValueError(rename(str(exc)))) from exc
    if sp.response_format is not None:  # xgrammar compiles off the event loop (then cached)
        try:
            await asyncio.to_thread(backend.compile_grammar, sp)
        except ValueError as exc:
            raise APIError.from_value_error(ValueError(rename(str(exc)))) from exc
    prefix = {"completions": "cmpl", "chat": "chatcmpl"}.get(endpoint, endpoint)
    job = Job(request, endpoint, f"{prefix}-{uuid.uuid4().hex}", budget, ids, sp, started,
              max_error)
    job.results = [Result() for _ in range(len(ids) * sp.n)]
    job._last_token_at = [None] * len(job.results)
    job._first_token_seen = [False] * len(ids)
    submitted = []
    bound = {} if max_error is None else {"max_error": max_error}  # backends without bounds: none
    try:
        for i, p in enumerate(ids):
            job.streams.append(backend.generate(p, sp, budget, f"{job.rid}-{i}", **bound))
            submitted.append(f"{job.rid}-{i}")
    except (ValueError, QueueFull) as exc:
        for rid in submitted:
            backend.abort(rid)
        if isinstance(exc, QueueFull):
            raise APIError(503, f"server busy: {exc}", code="queue_full") from exc
        raise APIError.from_value_error(ValueError(rename(str(exc)))) from exc
    return job


async def collect(job: Job) -> list[Result]:
    """Drain every stream; a client that goes away cancels them (which aborts the requests)."""

    async def drain(p, stream):
        async for out in until_failed(stream):
            job.observe(p, out)

    task = asyncio.ensure_future(asyncio.gather(*(drain(p, s) for p, s in enumerate(job.streams))))
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
        raise_if_failed(job.backend, res.last)
    return job.results


async def until_failed(stream) -> AsyncIterator[RequestOutput]:
    """A backend stream's outputs up to and including the first failed one: a failure ends the
    request (every choice); closing the stream then aborts what is left of it."""
    try:
        async for out in stream:
            yield out
            if out.error is not None:
                break
    finally:
        await stream.aclose()


def raise_if_failed(backend, out: RequestOutput | None) -> None:
    if out is None or out.error is None:
        return
    if out.error == SHUTTING_DOWN:
        raise APIError(503, SHUTTING_DOWN, code="shutting_down")
    if backend.error_status(out.error) == 400:  # the request's own settings cannot be served
        raise APIError(400, out.error, param=field_of(out.error), code="unsatisfiable_request")
    raise APIError(500, f"the request failed inside the engine: {out.error}", code="engine_error")


async def merged(job: Job) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave the job's streams as (choice index, output), in arrival order."""
    if len(job.streams) == 1:
        async for out in until_failed(job.streams[0]):
            yield job.observe(0, out), out
        return
    q: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(p, stream):
        try:
            async for out in until_failed(stream):
                await q.put((p, out))
        finally:
            q.put_nowait((p, done))

    tasks = [asyncio.ensure_future(pump(p, s)) for p, s in enumerate(job.streams)]
    left = len(job.streams)
    try:
        while left:
            p, out = await q.get()
            if out is done:
                left -= 1
                continue
            yield job.observe(p, out), out
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


def failure_event(job: Job, out: RequestOutput) -> str:
    """An SSE error event for a request that failed inside the backend mid-stream."""
    if out.error == SHUTTING_DOWN:
        return sse(error_body(503, SHUTTING_DOWN, None, "shutting_down"))
    if job.backend.error_status(out.error) == 400:
        return sse(error_body(400, out.error, field_of(out.error), "unsatisfiable_request"))
    return sse(error_body(500, f"the request failed inside the engine: {out.error}", None,
                          "engine_error"))


def sse(payload) -> str:
    """One server-sent event; payload is a pydantic model, a dict, or already-encoded text."""
    if isinstance(payload, dict):
        payload = json.dumps(payload)
    elif not isinstance(payload, str):
        payload = payload.model_dump_json()
    return f"data: {payload}\n\n"


def sampling_params(body, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None,
                    response_format: ResponseFormat | None = None) -> SamplingParams:
    """The request body's sampling fields -> SamplingParams (ValueError names the field).
    response_format: a constraint the route derived (tool_choice), else the body's own."""
    stop = body.stop if isinstance(body.stop, list) else ([body.stop] if body.stop else [])

    def given(value, default):
        return default if value is None else value

    if response_format is None:
        response_format = ResponseFormat.from_openai(body.response_format)
    return SamplingParams(
        temperature=given(body.temperature, 1.0), top_p=given(body.top_p, 1.0),
        top_k=given(body.top_k, -1), min_p=given(body.min_p, 0.0), max_tokens=max_tokens,
        stop=tuple(stop), stop_token_ids=tuple(body.stop_token_ids or ()), seed=body.seed,
        logprobs=logprobs, prompt_logprobs=prompt_logprobs, ignore_eos=body.ignore_eos,
        n=body.n, best_of=getattr(body, "best_of", None), min_tokens=given(body.min_tokens, 0),
        presence_penalty=given(body.presence_penalty, 0.0),
        frequency_penalty=given(body.frequency_penalty, 0.0),
        repetition_penalty=given(body.repetition_penalty, 1.0),
        logit_bias=body.logit_bias or None, response_format=response_format)

"""POST /v1/completions: text completion, streaming, logprobs and echo (lm-eval loglikelihood)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from base_sglang.server.deps import (
    BUDGET_HEADER,
    budget_label,
    check_model,
    require_api_key,
    resolve_budget,
)
from base_sglang.server.errors import APIError
from base_sglang.server.generation import (
    Result,
    collect,
    engine_error_event,
    merge,
    new_id,
    raise_if_failed,
    record,
    sampling_params,
    sse,
    sse_stream,
    submit,
    usage,
)
from base_sglang.server.schemas import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    Usage,
)

router = APIRouter(dependencies=[Depends(require_api_key)])
ENDPOINT = "completions"


@router.post("/v1/completions", response_model=CompletionResponse)
async def create_completion(body: CompletionRequest, request: Request):
    started = time.monotonic()
    backend = request.app.state.backend
    check_model(request, body.model)
    budget = resolve_budget(request, body.expert_budget)
    prompts = _prompt_ids(body.prompt, backend.tokenizer)
    params = sampling_params(body, body.max_tokens if body.max_tokens is not None else 16,
                             body.logprobs, body.logprobs if body.echo else None)
    rid = new_id("cmpl")
    headers = {BUDGET_HEADER: str(budget_label(budget, backend.num_experts))}
    streams = submit(backend, prompts, params, budget, rid)
    ctx = _Ctx(request, body, backend, rid, prompts, budget, started)
    if body.stream:
        return StreamingResponse(sse_stream(_events(ctx, streams)), media_type="text/event-stream",
                                 headers=headers)
    results = await collect(request, streams)
    record(request, ENDPOINT, 200, results, budget, started)
    choices = [_choice(ctx, i, res) for i, res in enumerate(results)]
    resp = CompletionResponse(id=rid, created=int(time.time()), model=backend.name, choices=choices,
                              usage=Usage(**usage(results, budget, backend.num_experts)))
    return JSONResponse(resp.model_dump(), headers=headers)


class _Ctx:
    def __init__(self, request, body, backend, rid, prompts, budget, started):
        self.request, self.body, self.backend, self.rid = request, body, backend, rid
        self.prompts, self.budget, self.started = prompts, budget, started
        self.created = int(time.time())


async def _events(ctx: _Ctx, streams):
    results = [Result() for _ in streams]
    echoed = [False] * len(streams)
    async for i, out in merge(streams):
        results[i].add(out)
        if out.error is not None:
            yield engine_error_event(out.error)
            continue
        text, logprobs = out.text, None
        if ctx.body.echo and not echoed[i]:
            text = _prompt_text(ctx, i) + text
            echoed[i] = True
        if ctx.body.logprobs is not None:
            logprobs = _logprobs(ctx, out.prompt_logprobs if ctx.body.echo else None,
                                 out.logprobs or [], ctx.prompts[i], 0)
        chunk = CompletionResponse(
            id=ctx.rid, created=ctx.created, model=ctx.backend.name,
            choices=[CompletionChoice(index=i, text=text, logprobs=logprobs,
                                      finish_reason=out.finish_reason if out.finished else None)])
        if out.finished:
            chunk.usage = Usage(**usage([results[i]], ctx.budget, ctx.backend.num_experts))
        yield sse(chunk)
    record(ctx.request, ENDPOINT, 200, results, ctx.budget, ctx.started)
    opts = ctx.body.stream_options
    if opts is not None and opts.include_usage:
        yield sse(CompletionResponse(id=ctx.rid, created=ctx.created, model=ctx.backend.name,
                                     choices=[],
                                     usage=Usage(**usage(results, ctx.budget,
                                                         ctx.backend.num_experts))))


def _choice(ctx: _Ctx, i: int, res: Result) -> CompletionChoice:
    raise_if_failed(res.last)
    text = (_prompt_text(ctx, i) if ctx.body.echo else "") + res.text
    logprobs = None
    if ctx.body.logprobs is not None:
        logprobs = _logprobs(ctx, res.prompt_logprobs if ctx.body.echo else None, res.logprobs,
                             ctx.prompts[i], 0)
    return CompletionChoice(index=i, text=text, logprobs=logprobs,
                            finish_reason=res.last.finish_reason)


def _prompt_text(ctx: _Ctx, i: int) -> str:
    p = ctx.body.prompt
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p and isinstance(p[0], str):
        return p[i]
    return ctx.backend.tokenizer.decode(ctx.prompts[i])


def _logprobs(ctx: _Ctx, prompt_lps, gen_lps, prompt_ids, offset: int) -> CompletionLogprobs:
    """OpenAI legacy logprobs: prompt tokens first (echo; the first has none), then generated."""
    tok = ctx.backend.tokenizer
    out = CompletionLogprobs()
    entries = []
    if prompt_lps is not None:
        entries += [(t, lp) for t, lp in zip(prompt_ids, prompt_lps)]
    entries += [(lp.token_id, lp) for lp in gen_lps]
    pos = offset
    for token_id, lp in entries:
        text = tok.decode([token_id])
        out.tokens.append(text)
        out.text_offset.append(pos)
        pos += len(text)
        if lp is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(lp.logprob)
        top = {tok.decode([t]): v for t, v in lp.top.items()}
        top.setdefault(text, lp.logprob)
        out.top_logprobs.append(top)
    return out


def _prompt_ids(prompt, tokenizer) -> list[list[int]]:
    """str | [str] | [int] | [[int]] -> token id lists."""
    if isinstance(prompt, str):
        prompts = [prompt]
    elif prompt and all(isinstance(x, int) for x in prompt):
        return [list(prompt)]
    else:
        prompts = list(prompt)
    if not prompts:
        raise APIError(400, "prompt: must not be empty", param="prompt")
    out = []
    for p in prompts:
        ids = tokenizer.encode(p) if isinstance(p, str) else list(p)
        if not ids:
            raise APIError(400, "prompt: must contain at least one token", param="prompt")
        out.append(ids)
    return out

"""POST /v1/completions: text completion, n / best_of choices, streaming, logprobs and echo
(lm-eval loglikelihood)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from base_sglang.server import serving
from base_sglang.server.deps import require_api_key
from base_sglang.server.routes import ERROR_RESPONSES, BudgetHeader
from base_sglang.server.schemas import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    Usage,
    stream_schema,
)

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/completions", response_model=CompletionResponse, responses={
    200: {"content": stream_schema(CompletionResponse)}, **ERROR_RESPONSES})
async def create_completion(
        body: CompletionRequest, request: Request,
        x_expert_budget: BudgetHeader = None):
    job = await serving.start(
        request, body, "completions", lambda: _prompt_ids(request, body.prompt),
        lambda ids: serving.sampling_params(
            body, body.max_tokens if body.max_tokens is not None else 16, body.logprobs,
            body.logprobs if body.echo else None))  # best_of > n with stream: refused in schemas
    if body.stream:
        request.app.state.metrics.observe_response("completions", 200)
        return StreamingResponse(serving.sse_frames(job, _events(job, body)),
                                 media_type="text/event-stream", headers=job.headers)
    results = await serving.collect(job)
    request.app.state.metrics.observe_response("completions", 200)
    choices = [_choice(job, body, i, res) for i, res in enumerate(results)]
    resp = CompletionResponse(id=job.rid, created=job.created, model=job.backend.name,
                              choices=choices, usage=Usage(**job.usage()))
    return JSONResponse(resp.model_dump(), headers=job.headers)


async def _events(job: serving.Job, body: CompletionRequest):
    echoed = [False] * len(job.results)
    async for i, out in serving.merged(job):
        if out.error is not None:
            yield serving.failure_event(job, out)
            continue
        text, logprobs, p = out.text, None, i // job.n
        if body.echo and not echoed[i]:
            text = _prompt_text(job, body, p) + text
            echoed[i] = True
        if body.logprobs is not None:
            logprobs = _logprobs(job, out.prompt_logprobs if body.echo else None,
                                 out.logprobs or [], job.prompts[p])
        if not (text or logprobs or out.finished):
            continue
        reason = out.finish_reason if out.finished and out.finish_reason != "abort" else None
        yield serving.sse(CompletionResponse(
            id=job.rid, created=job.created, model=job.backend.name,
            choices=[CompletionChoice(index=i, text=text, logprobs=logprobs,
                                      finish_reason=reason)]))
    opts = body.stream_options
    if opts is not None and opts.include_usage:  # OpenAI: once, last, with empty choices
        yield serving.sse(CompletionResponse(id=job.rid, created=job.created,
                                             model=job.backend.name, choices=[],
                                             usage=Usage(**job.usage())))


def _choice(job: serving.Job, body, i: int, res: serving.Result) -> CompletionChoice:
    p = i // job.n
    text = (_prompt_text(job, body, p) if body.echo else "") + res.text
    logprobs = None
    if body.logprobs is not None:
        logprobs = _logprobs(job, res.prompt_logprobs if body.echo else None, res.logprobs,
                             job.prompts[p])
    return CompletionChoice(index=i, text=text, logprobs=logprobs,
                            finish_reason=res.last.finish_reason)


def _prompt_text(job: serving.Job, body, p: int) -> str:
    """The text of prompt p (echo)."""
    prompt = body.prompt
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[p]
    return job.backend.tokenizer.decode(job.prompts[p])


def _logprobs(job: serving.Job, prompt_lps, gen_lps, prompt_ids) -> CompletionLogprobs:
    """OpenAI legacy logprobs: prompt tokens first (echo; the first has none), then generated."""
    tok = job.backend.tokenizer
    out = CompletionLogprobs()
    entries = []
    if prompt_lps is not None:
        entries += [(t, lp) for t, lp in zip(prompt_ids, prompt_lps)]
    entries += [(lp.token_id, lp) for lp in gen_lps]
    pos = 0
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


async def _prompt_ids(request: Request, prompt) -> list[list[int]]:
    """str | [str] | [int] | [[int]] -> token id lists (texts tokenised off the event loop)."""
    if isinstance(prompt, str):
        prompt = [prompt]
    elif prompt and all(isinstance(x, int) for x in prompt):
        return [list(prompt)]
    if not prompt:
        raise serving.APIError(400, "prompt: must not be empty", param="prompt")
    return [await serving.encode(request, p, "prompt") if isinstance(p, str) else list(p)
            for p in prompt]

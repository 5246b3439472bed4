"""POST /v1/chat/completions: the tokenizer's chat template, SSE chunks ending in [DONE]."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse, StreamingResponse

from base_sglang.core.budget import BUDGET_HEADER
from base_sglang.server import serving
from base_sglang.server.deps import require_api_key
from base_sglang.server.errors import APIError
from base_sglang.server.routes import BUDGET_HEADER_SCHEMA, ERROR_RESPONSES, budget_header_doc
from base_sglang.server.schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatResponseMessage,
    ChatTokenLogprob,
    TopLogprob,
    Usage,
    stream_schema,
)

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses={
    200: {"content": stream_schema(ChatCompletionChunk)}, **ERROR_RESPONSES})
async def create_chat_completion(
        body: ChatCompletionRequest, request: Request,
        x_expert_budget: Annotated[str, Header(
            alias=BUDGET_HEADER, description=budget_header_doc,
            json_schema_extra=BUDGET_HEADER_SCHEMA)] = None):
    backend = request.app.state.backend

    async def prompts():
        text = await asyncio.to_thread(_render, body, backend.tokenizer)
        return [await serving.encode(request, text, "messages", add_special_tokens=False)]

    def params(ids):
        max_tokens = body.max_completion_tokens or body.max_tokens
        if max_tokens is None:
            max_tokens = max(1, backend.max_model_len - len(ids[0]))
        top = (body.top_logprobs or 0) if body.logprobs else None
        return serving.sampling_params(body, max_tokens, top, None)

    job = await serving.start(request, body, "chat", prompts, params)
    if body.stream:
        request.app.state.metrics.observe_response("chat", 200)
        return StreamingResponse(serving.sse_frames(job, _events(job, body)),
                                 media_type="text/event-stream", headers=job.headers)
    [res] = await serving.collect(job)
    request.app.state.metrics.observe_response("chat", 200)
    choice = ChatChoice(index=0, message=ChatResponseMessage(content=res.text),
                        logprobs=_logprobs(backend.tokenizer, res.logprobs) if body.logprobs else None,
                        finish_reason=res.last.finish_reason)
    resp = ChatCompletionResponse(id=job.rid, created=job.created, model=backend.name,
                                  choices=[choice], usage=Usage(**job.usage()))
    return JSONResponse(resp.model_dump(), headers=job.headers)


async def _events(job: serving.Job, body: ChatCompletionRequest):
    name, tok = job.backend.name, job.backend.tokenizer

    def chunk(delta: ChatDelta, finish=None, logprobs=None) -> str:
        choice = ChatChunkChoice(index=0, delta=delta, logprobs=logprobs, finish_reason=finish)
        out = ChatCompletionChunk(id=job.rid, created=job.created, model=name,
                                  choices=[choice]).model_dump(exclude={"usage"})
        out["choices"][0]["delta"] = delta.model_dump(exclude_none=True)  # OpenAI omits role
        return serving.sse(json.dumps(out))

    yield chunk(ChatDelta(role="assistant", content=""))
    async for _, out in serving.merged(job):
        if out.error is not None:
            yield serving.failure_event(out)
            break
        lps = _logprobs(tok, out.logprobs or []) if body.logprobs else None
        reason = out.finish_reason if out.finished and out.finish_reason != "abort" else None
        if out.text or lps or reason:
            yield chunk(ChatDelta(content=out.text), reason, lps)
    if body.stream_options is not None and body.stream_options.include_usage:
        yield serving.sse(ChatCompletionChunk(id=job.rid, created=job.created, model=name,
                                              choices=[], usage=Usage(**job.usage())))


def _render(body: ChatCompletionRequest, tokenizer) -> str:
    messages = []
    for i, m in enumerate(body.messages):
        content = m.content
        if isinstance(content, list):
            if any(p.type != "text" for p in content):
                raise APIError(400, f"messages.{i}.content: only text parts are supported",
                               param=f"messages.{i}.content")
            content = "".join(p.text or "" for p in content)
        messages.append({"role": m.role, "content": content or ""})
    if not getattr(tokenizer, "chat_template", None):
        raise APIError(400, "messages: this model's tokenizer has no chat template; "
                            "use /v1/completions", param="messages")
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _logprobs(tokenizer, lps) -> ChatLogprobs:
    content = []
    for lp in lps:
        text = tokenizer.decode([lp.token_id])
        top = [TopLogprob(token=tokenizer.decode([t]), logprob=v,
                          bytes=list(tokenizer.decode([t]).encode()))
               for t, v in lp.top.items()]
        content.append(ChatTokenLogprob(token=text, logprob=lp.logprob, bytes=list(text.encode()),
                                        top_logprobs=top))
    return ChatLogprobs(content=content)

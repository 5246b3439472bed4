"""POST /v1/chat/completions: the tokenizer's chat template, SSE chunks ending in [DONE]."""

from __future__ import annotations

import json
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
)

router = APIRouter(dependencies=[Depends(require_api_key)])
ENDPOINT = "chat"


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse)
async def create_chat_completion(body: ChatCompletionRequest, request: Request):
    started = time.monotonic()
    backend = request.app.state.backend
    check_model(request, body.model)
    budget = resolve_budget(request, body.expert_budget)
    prompt_ids = _render(body, backend.tokenizer)
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is None:
        max_tokens = max(1, backend.max_model_len - len(prompt_ids))
    top = (body.top_logprobs or 0) if body.logprobs else None
    params = sampling_params(body, max_tokens, top, None)
    rid = new_id("chatcmpl")
    headers = {BUDGET_HEADER: str(budget_label(budget, backend.num_experts))}
    [stream] = submit(backend, [prompt_ids], params, budget, rid)
    if body.stream:
        return StreamingResponse(sse_stream(_events(request, body, backend, rid, stream, budget,
                                                    started)),
                                 media_type="text/event-stream", headers=headers)
    [res] = await collect(request, [stream])
    record(request, ENDPOINT, 200, [res], budget, started)
    raise_if_failed(res.last)
    choice = ChatChoice(index=0, message=ChatResponseMessage(content=res.text),
                        logprobs=_logprobs(backend.tokenizer, res.logprobs) if body.logprobs else None,
                        finish_reason=res.last.finish_reason)
    resp = ChatCompletionResponse(id=rid, created=int(time.time()), model=backend.name,
                                  choices=[choice],
                                  usage=Usage(**usage([res], budget, backend.num_experts)))
    return JSONResponse(resp.model_dump(), headers=headers)


async def _events(request, body, backend, rid, stream, budget, started):
    created = int(time.time())

    def chunk(delta: ChatDelta, finish=None, logprobs=None, use=None) -> str:
        choice = ChatChunkChoice(index=0, delta=delta, logprobs=logprobs, finish_reason=finish)
        body = ChatCompletionChunk(id=rid, created=created, model=backend.name, choices=[choice],
                                   usage=use).model_dump()
        body["choices"][0]["delta"] = delta.model_dump(exclude_none=True)  # OpenAI omits role
        return sse(json.dumps(body))

    yield chunk(ChatDelta(role="assistant", content=""))
    res = Result()
    async for out in stream:
        res.add(out)
        if out.error is not None:
            yield engine_error_event(out.error)
            break
        lps = _logprobs(backend.tokenizer, out.logprobs or []) if body.logprobs else None
        use = Usage(**usage([res], budget, backend.num_experts)) if out.finished else None
        if out.text or lps or out.finished:
            yield chunk(ChatDelta(content=out.text), out.finish_reason if out.finished else None,
                        lps, use)
    record(request, ENDPOINT, 200, [res], budget, started)
    if body.stream_options is not None and body.stream_options.include_usage:
        yield sse(ChatCompletionChunk(id=rid, created=created, model=backend.name, choices=[],
                                      usage=Usage(**usage([res], budget, backend.num_experts))))


def _render(body: ChatCompletionRequest, tokenizer) -> list[int]:
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
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


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

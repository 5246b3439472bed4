"""POST /v1/chat/completions: the tokenizer's chat template, n choices, tools, SSE chunks ending
in [DONE]."""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from base_sglang.server import serving
from base_sglang.server.deps import require_api_key
from base_sglang.server.errors import APIError
from base_sglang.server.routes import ERROR_RESPONSES, BudgetHeader
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
from base_sglang.server.tool_calling import ToolSetup, openai_calls

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses={
    200: {"content": stream_schema(ChatCompletionChunk)}, **ERROR_RESPONSES})
async def create_chat_completion(
        body: ChatCompletionRequest, request: Request,
        x_expert_budget: BudgetHeader = None):
    backend = request.app.state.backend
    tools = ToolSetup.create(body, request.app.state.supports_tools)

    async def prompts():
        text = await asyncio.to_thread(render, body.messages, backend.tokenizer, tools.tools)
        return [await serving.encode(request, text, "messages", add_special_tokens=False)]

    def params(ids):
        max_tokens = body.max_completion_tokens or body.max_tokens
        if max_tokens is None:
            max_tokens = max(1, backend.max_model_len - len(ids[0]))
        top = (body.top_logprobs or 0) if body.logprobs else None
        return serving.sampling_params(body, max_tokens, top, None, tools.constraint(body))

    job = await serving.start(request, body, "chat", prompts, params, rename=tools.rename)
    if body.stream:
        request.app.state.metrics.observe_response("chat", 200)
        return StreamingResponse(serving.sse_frames(job, _events(job, body, tools)),
                                 media_type="text/event-stream", headers=job.headers)
    results = await serving.collect(job)
    request.app.state.metrics.observe_response("chat", 200)
    choices = []
    for i, res in enumerate(results):
        content, calls = tools.parse(res.text)
        lps = _logprobs(backend.tokenizer, res.logprobs) if body.logprobs else None
        choices.append(ChatChoice(
            index=i, message=ChatResponseMessage(content=content, tool_calls=openai_calls(calls)),
            logprobs=lps, finish_reason=tools.finish_reason(res.last.finish_reason, calls)))
    resp = ChatCompletionResponse(id=job.rid, created=job.created, model=backend.name,
                                  choices=choices, usage=Usage(**job.usage()))
    return JSONResponse(resp.model_dump(), headers=job.headers)


async def _events(job: serving.Job, body: ChatCompletionRequest, tools: ToolSetup):
    name, tok = job.backend.name, job.backend.tokenizer

    def chunk(i: int, delta: ChatDelta, finish=None, logprobs=None) -> str:
        choice = ChatChunkChoice(index=i, delta=delta, logprobs=logprobs, finish_reason=finish)
        out = ChatCompletionChunk(id=job.rid, created=job.created, model=name,
                                  choices=[choice]).model_dump(exclude={"usage"})
        out["choices"][0]["delta"] = delta.model_dump(exclude_none=True)  # OpenAI omits role
        return serving.sse(json.dumps(out))

    for i in range(len(job.results)):  # each choice opens with its role, as OpenAI's do
        yield chunk(i, ChatDelta(role="assistant", content=""))
    parsers = [tools.stream() for _ in job.results]
    called = [False] * len(job.results)
    async for i, out in serving.merged(job):
        if out.error is not None:
            yield serving.failure_event(job, out)
            break
        lps = _logprobs(tok, out.logprobs or []) if body.logprobs else None
        finished = out.finished and out.finish_reason != "abort"
        content, calls = parsers[i].feed(out.text, out.finished)
        called[i] |= bool(calls)
        reason = tools.finish_reason(out.finish_reason, [True] if called[i] else []) \
            if finished else None
        if content or lps or reason or calls:
            yield chunk(i, ChatDelta(content=(content or None) if calls else content,
                                     tool_calls=calls or None), reason, lps)
    if body.stream_options is not None and body.stream_options.include_usage:
        yield serving.sse(ChatCompletionChunk(id=job.rid, created=job.created, model=name,
                                              choices=[], usage=Usage(**job.usage())))


def render(chat: list, tokenizer, tools: list[dict], add_generation_prompt: bool = True) -> str:
    """The chat template's prompt text for a request's messages (and tools)."""
    messages = []
    for i, m in enumerate(chat):
        content = m.content
        if isinstance(content, list):
            if any(p.type != "text" for p in content):
                raise APIError(400, f"messages.{i}.content: only text parts are supported",
                               param=f"messages.{i}.content")
            content = "".join(p.text or "" for p in content)
        msg = {"role": m.role, "content": content or ""}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.tool_calls:  # templates index arguments as a mapping (vLLM hands them one too)
            msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                for c in m.tool_calls]
        messages.append(msg)
    if not getattr(tokenizer, "chat_template", None):
        raise APIError(400, "messages: this model's tokenizer has no chat template; "
                            "use /v1/completions", param="messages")
    kwargs = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                         tokenize=False, **kwargs)


def _arguments(text: str):
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


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

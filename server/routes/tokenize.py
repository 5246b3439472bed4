"""POST /tokenize and /detokenize (also under /v1/), shaped as vLLM's: {"model", "prompt" |
"messages", "add_special_tokens"} -> {"count", "max_model_len", "tokens"}; {"model", "tokens"} ->
{"prompt"} (and SGLang's "text"). SGLang's list forms (several prompts / token lists) work too.
Tokenising runs in a worker thread; a prompt too long for the model by any tokenisation is 400."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request

from base_sglang.server import serving
from base_sglang.server.deps import check_model, require_api_key
from base_sglang.server.errors import APIError
from base_sglang.server.routes import ERROR_RESPONSES
from base_sglang.server.routes.chat import render
from base_sglang.server.schemas_native import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from base_sglang.server.tool_calling import NO_TOOLS

router = APIRouter(dependencies=[Depends(require_api_key)])
_ERRORS = {k: v for k, v in ERROR_RESPONSES.items() if k in (400, 401, 404, 413)}


@router.post("/tokenize", response_model=TokenizeResponse, responses=_ERRORS)
@router.post("/v1/tokenize", response_model=TokenizeResponse, responses=_ERRORS,
             include_in_schema=False)
async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    backend = request.app.state.backend
    if body.model is not None:
        check_model(request, body.model)
    tok = backend.tokenizer
    if body.messages is not None:
        tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
        if tools and not request.app.state.supports_tools:
            raise APIError(400, NO_TOOLS, param="tools", code="tools_not_supported")
        text = await asyncio.to_thread(render, body.messages, tok, tools,
                                       body.add_generation_prompt)
        texts, field, special = [text], "messages", bool(body.add_special_tokens)
    else:
        texts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        field = "prompt"
        special = body.add_special_tokens is not False
    ids = [await serving.encode(request, t, field, add_special_tokens=special) for t in texts]
    strs = None
    if body.return_token_strs:
        strs = await asyncio.to_thread(lambda: [tok.convert_ids_to_tokens(x) for x in ids])
    one = isinstance(body.prompt, str) or body.messages is not None
    request.app.state.metrics.observe_response("tokenize", 200)
    return TokenizeResponse(count=len(ids[0]) if one else [len(x) for x in ids],
                            max_model_len=backend.max_model_len, tokens=ids[0] if one else ids,
                            token_strs=(strs[0] if one else strs) if strs is not None else None)


@router.post("/detokenize", response_model=DetokenizeResponse, responses=_ERRORS)
@router.post("/v1/detokenize", response_model=DetokenizeResponse, responses=_ERRORS,
             include_in_schema=False)
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    backend = request.app.state.backend
    if body.model is not None:
        check_model(request, body.model)
    tok = backend.tokenizer
    one = not (body.tokens and isinstance(body.tokens[0], list))
    lists = [body.tokens] if one else body.tokens
    vocab = len(tok)
    if any(t >= vocab for ids in lists for t in ids):
        raise APIError(400, f"tokens: token ids must be in [0, {vocab})", param="tokens")
    texts = await asyncio.to_thread(lambda: [tok.decode(ids) for ids in lists])
    request.app.state.metrics.observe_response("tokenize", 200)
    out = texts[0] if one else texts
    return DetokenizeResponse(prompt=out, text=out)

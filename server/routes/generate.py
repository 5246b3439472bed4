"""POST /generate: SGLang's native request shape, for the tools written against it.

{"text" | "input_ids", "sampling_params": {"max_new_tokens", "temperature", ...}, "stream"} ->
{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
...}} (a list for a batch or n > 1); streaming sends `data: {...}` events whose text, output_ids
and completion_tokens are cumulative (SGLang's default), then `data: [DONE]`. The budget is
sampling_params.custom_params.expert_budget (as the SGLang plugin reads it) or X-Expert-Budget.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from base_sglang.protocol import ResponseFormat, SamplingParams
from base_sglang.server import serving
from base_sglang.server.deps import require_api_key
from base_sglang.server.routes import ERROR_RESPONSES, BudgetHeader
from base_sglang.server.schemas_native import GenerateRequest, GenerateSamplingParams

router = APIRouter(dependencies=[Depends(require_api_key)])
_ONE = {"type": "object", "required": ["text", "output_ids", "meta_info"], "properties": {
    "text": {"type": "string"}, "output_ids": {"type": "array", "items": {"type": "integer"}},
    "meta_info": {"type": "object"}, "index": {"type": "integer"}}}
_RESPONSES = {200: {"content": {
    "application/json": {"schema": {"anyOf": [_ONE, {"type": "array", "items": _ONE}]}},
    "text/event-stream": {"schema": {"type": "object", "required": ["data"], "properties": {
        "data": {"type": "string", "description": "one output as JSON (cumulative), an "
                                                  "ErrorResponse, finally [DONE]"}}}}}},
    **ERROR_RESPONSES}


@router.post("/generate", responses=_RESPONSES)
async def generate(
        body: GenerateRequest, request: Request,
        x_expert_budget: BudgetHeader = None):
    job = await serving.start(request, body, "generate", lambda: _prompt_ids(request, body),
                              lambda ids: sampling_params(body), rename=rename)
    if body.stream:
        request.app.state.metrics.observe_response("generate", 200)
        return StreamingResponse(serving.sse_frames(job, _events(job, body)),
                                 media_type="text/event-stream", headers=job.headers)
    results = await serving.collect(job)
    request.app.state.metrics.observe_response("generate", 200)
    outs = [_output(job, body, i, r.text, r.token_ids, r) for i, r in enumerate(results)]
    many = body.is_batch or job.n > 1
    return JSONResponse(outs if many else outs[0], headers=job.headers)


async def _events(job: serving.Job, body: GenerateRequest):
    many = body.is_batch or job.n > 1
    async for i, out in serving.merged(job):
        if out.error is not None:
            yield serving.failure_event(job, out)
            break
        res = job.results[i]
        if out.token_ids or out.text or out.finished:
            event = _output(job, body, i, res.text, res.token_ids, res)
            if many:
                event["index"] = i
            yield serving.sse(event)


def _output(job: serving.Job, body: GenerateRequest, i: int, text: str, ids: list[int],
            res: serving.Result) -> dict:
    last = res.last
    reason = last.finish_reason if last is not None and last.finished else None
    finish = None if reason is None else {"type": reason if reason in ("stop", "length")
                                          else "abort"}
    if reason == "length":
        finish["length"] = len(ids)
    meta = {"id": f"{job.rid}-{i}", "finish_reason": finish,
            "prompt_tokens": len(job.prompts[i // job.n]), "completion_tokens": len(ids),
            "cached_tokens": 0, "e2e_latency": time.monotonic() - job.started,
            "expert_budget": job.label,
            "experts_per_layer": last.experts_per_layer if last else None,
            "experts_per_layer_dense": last.experts_per_layer_routed if last else None}
    if body.return_logprob:
        meta.update(_logprobs(job, body, i, res))
    return {"text": text, "output_ids": list(ids), "meta_info": meta}


def _logprobs(job: serving.Job, body: GenerateRequest, i: int, res: serving.Result) -> dict:
    """SGLang's logprob lists: (logprob, token id, None) per token, top lists per position."""
    def top(lp):
        return [(v, t, None) for t, v in lp.top.items()][:body.top_logprobs_num]

    out = {"output_token_logprobs": [(lp.logprob, lp.token_id, None) for lp in res.logprobs]}
    if body.top_logprobs_num:
        out["output_top_logprobs"] = [top(lp) for lp in res.logprobs]
    if body.logprob_start_len == 0 and res.prompt_logprobs is not None:
        out["input_token_logprobs"] = [(None if lp is None else lp.logprob, t, None) for t, lp
                                       in zip(job.prompts[i // job.n], res.prompt_logprobs)]
        if body.top_logprobs_num:
            out["input_top_logprobs"] = [None if lp is None else top(lp)
                                         for lp in res.prompt_logprobs]
    return out


def sampling_params(body: GenerateRequest) -> SamplingParams:
    """SGLang's sampling_params -> SamplingParams (SGLang's defaults; ValueError names the
    field as SamplingParams does)."""
    sp = body.sampling_params

    def given(value, default):
        return default if value is None else value

    stop = [sp.stop] if isinstance(sp.stop, str) else list(sp.stop or [])
    logprobs = body.top_logprobs_num if body.return_logprob else None
    fmt = None if sp.json_schema is None else ResponseFormat.create("json_schema", sp.json_schema)
    return SamplingParams(
        temperature=given(sp.temperature, 1.0), top_p=given(sp.top_p, 1.0),
        top_k=given(sp.top_k, -1), min_p=given(sp.min_p, 0.0),
        max_tokens=given(sp.max_new_tokens, 128), min_tokens=given(sp.min_new_tokens, 0),
        stop=tuple(stop), stop_token_ids=tuple(sp.stop_token_ids or ()), seed=sp.sampling_seed,
        ignore_eos=bool(sp.ignore_eos), n=given(sp.n, 1), logprobs=logprobs,
        prompt_logprobs=logprobs if body.return_logprob and body.logprob_start_len == 0
        else None,
        presence_penalty=given(sp.presence_penalty, 0.0),
        frequency_penalty=given(sp.frequency_penalty, 0.0),
        repetition_penalty=given(sp.repetition_penalty, 1.0), logit_bias=sp.logit_bias or None,
        response_format=fmt)


def rename(message: str) -> str:
    """Grammar and sampling errors name SGLang's fields (sampling_params.json_schema, ...)."""
    for ours, theirs in (("response_format", "json_schema"), ("max_tokens", "max_new_tokens"),
                         ("min_tokens", "min_new_tokens"), ("seed", "sampling_seed")):
        if message.startswith(f"{ours}:"):
            return f"sampling_params.{theirs}:" + message.removeprefix(f"{ours}:")
    head, sep, _ = message.partition(":")
    if sep and head in GenerateSamplingParams.model_fields:
        return f"sampling_params.{message}"
    return message


async def _prompt_ids(request: Request, body: GenerateRequest) -> list[list[int]]:
    if body.input_ids is not None:
        ids = body.input_ids
        return [list(x) for x in ids] if body.is_batch else [list(ids)]
    texts = body.text if isinstance(body.text, list) else [body.text]
    if not texts:
        raise serving.APIError(400, "text: must not be empty", param="text")
    return [await serving.encode(request, t, "text") for t in texts]

"""OpenAI request and response bodies (pydantic lives only here and in settings.py).

Requests validate every field with a message that names it. Fields with OpenAI semantics that this
server does not implement yet are refused with 400 naming the field (UNSUPPORTED), never silently
ignored; unknown fields outside OpenAI's API are ignored, as OpenAI's own servers do.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from base_sglang.core.budget import BUDGET_FIELD, DENSE_LABEL, parse_budget

BUDGET_DOC = ("experts each MoE layer may execute per decode step for this request: an integer "
              f"1..E or \"{DENSE_LABEL}\"; the X-Expert-Budget header carries the same value "
              "(this field wins)")
BUDGET_SCHEMA = {"anyOf": [{"type": "integer", "minimum": 1},
                           {"type": "string", "pattern": "^\\s*([Dd][Ee][Nn][Ss][Ee]|[+]?[0-9]+)\\s*$"},
                           {"type": "null"}],
                 "description": BUDGET_DOC}
# int 1..E or "dense" (the range against E and the server's limits is checked per request)
Budget = Annotated[Any, WithJsonSchema(BUDGET_SCHEMA)]
_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
Prompt = Annotated[Any, WithJsonSchema({"anyOf": [
    {"type": "string", "minLength": 1},
    {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
    _IDS, {"type": "array", "minItems": 1, "items": _IDS}],
    "description": "a string, a list of strings, token ids, or a list of token-id lists "
                   "(none of them empty)"})]
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what a torch.Generator accepts
Finite = dict(allow_inf_nan=False)

# OpenAI fields this server does not implement yet: 400 naming the field unless the value is the
# OpenAI default (a client library that always sends the default keeps working).
UNSUPPORTED = {
    "common": {"logit_bias": None, "frequency_penalty": 0, "presence_penalty": 0},
    "completions": {"best_of": 1, "suffix": None},
    "chat": {"response_format": None, "tools": None, "tool_choice": None, "functions": None,
             "function_call": None, "parallel_tool_calls": None, "audio": None,
             "modalities": None, "prediction": None},
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # no "4" for 4, no false for 0
    KIND: ClassVar[str] = "common"

    model: str
    temperature: float | None = Field(None, ge=0.0, le=2.0, **Finite)
    top_p: float | None = Field(None, gt=0.0, le=1.0, **Finite)
    top_k: int | None = Field(None, ge=-1, description="vLLM/SGLang extension; -1 or 0 = off")
    n: int = Field(1, ge=1, le=1, description="choices per prompt (only 1 is supported yet)")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(None, description="up to 4 stop strings")
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    ignore_eos: bool = Field(False, description="vLLM/SGLang extension, for benchmarks")
    expert_budget: Budget = None
    user: str | None = None

    @field_validator("expert_budget")
    @classmethod
    def _budget(cls, v):
        if v is not None:
            parse_budget(v, BUDGET_FIELD)  # the syntax; E and the server's range per request
        return v

    @model_validator(mode="after")
    def _refuse_unimplemented(self):
        extra = self.model_extra or {}
        table = {**UNSUPPORTED["common"], **UNSUPPORTED[self.KIND]}
        for name, default in table.items():
            if name in extra and extra[name] is not None and extra[name] != default:
                raise ValueError(f"{name}: not supported by this server yet")
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stop) > 4:
            raise ValueError("stop: at most 4 stop sequences")
        return self


class CompletionRequest(_Sampling):
    KIND: ClassVar[str] = "completions"

    prompt: Prompt

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v):
        def ids(x):
            return isinstance(x, list) and bool(x) and all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in x)

        if isinstance(v, str) and v:
            return v
        if isinstance(v, list) and v and (ids(v) or all(isinstance(p, str) and p for p in v)
                                          or all(ids(p) for p in v)):
            return v
        raise ValueError("prompt: must be a non-empty string, a list of non-empty strings, a "
                         "non-empty list of token ids (integers >= 0), or a list of such lists")
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=5, description="top alternatives per token, 0..5")
    echo: bool = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None


class ChatCompletionRequest(_Sampling):
    KIND: ClassVar[str] = "chat"

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


# ---- responses ------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    expert_budget: int | str  # the applied request budget ("dense" or experts per layer per step)
    experts_per_layer: float | None = None  # mean distinct experts executed per MoE layer and step
    experts_per_layer_dense: float | None = None  # the same, had the steps run dense


class CompletionLogprobs(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "base-sglang"
    num_experts: int | None = None  # routed experts per MoE layer (the dense budget)
    policy: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def stream_schema(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI content for a route that also answers text/event-stream (stream=true): the schema
    of one event (its `data` is a JSON text, or [DONE])."""
    return {"text/event-stream": {"schema": {
        "type": "object", "required": ["data"],
        "properties": {"data": {"type": "string", "description": (
            f"a {model.__name__} as JSON; an ErrorResponse as JSON if the request fails part-way; "
            "finally the text [DONE]")}, "event": {"type": "string"}},
        "description": "server-sent events"}}}

"""OpenAI request and response bodies (pydantic lives only here and in settings.py).

Requests validate every field with a message that names it. Fields with OpenAI semantics that this
server does not implement are refused with 400 naming the field (UNSUPPORTED), never silently
ignored; unknown fields outside OpenAI's API are ignored, as OpenAI's own servers do. The vLLM /
SGLang sampling extensions (top_k, min_p, repetition_penalty, min_tokens, stop_token_ids,
ignore_eos) are fields of their own, sent by the openai client through `extra_body`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from base_sglang.core.budget import BUDGET_FIELD, DENSE_LABEL, parse_budget
from base_sglang.protocol import INT64_MAX, MAX_N, ResponseFormat

BUDGET_DOC = ("experts each MoE layer may execute per decode step for this request: an integer "
              f"1..E or \"{DENSE_LABEL}\"; the X-Expert-Budget header carries the same value "
              "(this field wins)")
BUDGET_SCHEMA = {"anyOf": [{"type": "integer", "minimum": 1},
                           {"type": "string", "pattern": "^\\s*([Dd][Ee][Nn][Ss][Ee]|[+]?[0-9]+)\\s*$"},
                           {"type": "null"}],
                 "description": BUDGET_DOC}
# int 1..E or "dense" (the range against E and the server's limits is checked per request)
Budget = Annotated[Any, WithJsonSchema(BUDGET_SCHEMA)]
BOUND_SCHEMA = {
    "type": "object", "required": ["max_error"], "additionalProperties": False,
    "description": "error-targeted budget (native backend, policies base_plus / base / oracle): "
                   "each decode step runs the smallest expert budget that keeps this request's "
                   "predicted relative removal error per MoE layer within max_error, at most "
                   "max_experts (default: the server's largest budget); BENCHMARKS.md calibrates "
                   "the bound against measured perplexity",
    "properties": {"max_error": {"type": "number", "minimum": 0, "maximum": 1},
                   "max_experts": {"type": "integer", "minimum": 1}}}
REQUEST_BUDGET_SCHEMA = {"anyOf": [*BUDGET_SCHEMA["anyOf"][:2], BOUND_SCHEMA, {"type": "null"}],
                         "description": BUDGET_DOC + "; or an error-targeted budget object"}
# Budget, or {"max_error": 0..1, "max_experts": 1..E} (checked per request: E, the policy)
RequestBudget = Annotated[Any, WithJsonSchema(REQUEST_BUDGET_SCHEMA)]
_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
Prompt = Annotated[Any, WithJsonSchema({"anyOf": [
    {"type": "string", "minLength": 1},
    {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
    _IDS, {"type": "array", "minItems": 1, "items": _IDS}],
    "description": "a string, a list of strings, token ids, or a list of token-id lists "
                   "(none of them empty)"})]
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what a torch.Generator accepts
Finite = dict(allow_inf_nan=False)
TOKEN_ID = "^[0-9]{1,9}$"  # a token id as a JSON object key (logit_bias)
LOGIT_BIAS_SCHEMA = {"anyOf": [{"type": "object", "propertyNames": {"pattern": TOKEN_ID},
                                "additionalProperties": {"type": "number", "minimum": -100,
                                                         "maximum": 100}},
                               {"type": "null"}],
                     "description": "token id (a decimal string, as JSON keys are; below the "
                                    "vocabulary size) -> bias in [-100, 100] added to its logit"}
LogitBias = Annotated[Any, WithJsonSchema(LOGIT_BIAS_SCHEMA)]
RESPONSE_FORMAT_SCHEMA = {"anyOf": [
    {"type": "object", "required": ["type"], "additionalProperties": False,
     "properties": {"type": {"enum": ["text", "json_object"]}}},
    {"type": "object", "required": ["type", "json_schema"], "additionalProperties": False,
     "properties": {"type": {"enum": ["json_schema"]}, "json_schema": {
         "type": "object", "required": ["schema"],
         "additionalProperties": False,
         "properties": {"name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                        "description": {"type": "string"}, "strict": {"type": ["boolean", "null"]},
                        "schema": {"type": "object"}}}}},
    {"type": "null"}],
    "description": "constrained decoding (xgrammar): json_object = any JSON object, json_schema = "
                   "JSON valid against `schema`; a schema the grammar library cannot compile is "
                   "refused with 400 naming response_format"}
ResponseFormatBody = Annotated[Any, WithJsonSchema(RESPONSE_FORMAT_SCHEMA)]
JSON_SCHEMA_KEYS = {"name", "description", "schema", "strict"}

# OpenAI fields this server does not implement: 400 naming the field unless the value is the
# OpenAI default (a client library that always sends the default keeps working).
UNSUPPORTED = {
    "common": {},
    "completions": {"suffix": None},
    "chat": {"functions": None, "function_call": None, "audio": None, "modalities": None,
             "prediction": None},
}


def check_logit_bias(v, name: str):
    """OpenAI's logit_bias: {token id as a decimal string: bias in [-100, 100]} (or None)."""
    if v is None:
        return v
    if not isinstance(v, dict):
        raise ValueError(f"{name}: must be an object of token id -> bias")
    for key, bias in v.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 9):
            raise ValueError(f"{name}: keys must be token ids (decimal strings), got {key!r}")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                or not -100 <= bias <= 100:  # also NaN
            raise ValueError(f"{name}: the bias of token {key} must be a number in [-100, 100], "
                             f"got {bias!r}")
    return v


def check_response_format(v):
    """OpenAI's response_format object, exactly as RESPONSE_FORMAT_SCHEMA documents it."""
    if v is None:
        return v
    if not isinstance(v, dict) or v.get("type") not in ("text", "json_object", "json_schema"):
        raise ValueError("response_format: must be an object with type text, json_object or "
                         "json_schema")
    allowed = {"type", "json_schema"} if v["type"] == "json_schema" else {"type"}
    spec = v.get("json_schema")
    unknown = sorted(set(v) - allowed) + sorted(set(spec or {}) - JSON_SCHEMA_KEYS
                                                if isinstance(spec, dict) else [])
    if unknown:
        raise ValueError(f"response_format: unknown field {unknown[0]!r}")
    if v["type"] == "json_schema":
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ValueError("response_format: json_schema needs {\"schema\": {...}} (a JSON "
                             "Schema object)")
        name = spec.get("name", "x")
        if not (isinstance(name, str) and re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name)):
            raise ValueError("response_format: json_schema.name must match ^[a-zA-Z0-9_-]{1,64}$")
        if not isinstance(spec.get("description", ""), str) \
                or not isinstance(spec.get("strict", False), (bool, type(None))):
            raise ValueError("response_format: json_schema.description is a string, "
                             "json_schema.strict a boolean")
    ResponseFormat.from_openai(v)  # ValueError "response_format: ..."
    return v


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # no "4" for 4, no false for 0
    KIND: ClassVar[str] = "common"

    model: str
    temperature: float | None = Field(None, ge=0.0, le=2.0, **Finite)
    top_p: float | None = Field(None, gt=0.0, le=1.0, **Finite)
    top_k: int | None = Field(None, ge=-1, le=INT64_MAX,
                              description="vLLM/SGLang extension; -1 or 0 = off")
    min_p: float | None = Field(None, ge=0.0, le=1.0, **Finite, description=(
        "vLLM/SGLang extension: drop tokens below min_p x the top probability; 0 = off"))
    n: int = Field(1, ge=1, le=MAX_N, description=(
        "choices per prompt (they share one prefill); at most the server's running sequences"))
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(None, description="up to 4 stop strings")
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, max_length=256, description="vLLM/SGLang extension: token ids that end the output "
                                          "(kept in the output, as vLLM)")
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    ignore_eos: bool = Field(False, description="vLLM/SGLang extension: EOS does not end the "
                                                "output (for benchmarks)")
    min_tokens: int | None = Field(None, ge=0, description=(
        "vLLM/SGLang extension: EOS and stop_token_ids are masked until this many tokens "
        "(<= max_tokens)"))
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, **Finite, description=(
        "OpenAI's: subtracted once from the logit of every token already in the output"))
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, **Finite, description=(
        "OpenAI's: subtracted from a token's logit per occurrence in the output"))
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0, **Finite, description=(
        "vLLM/SGLang extension over prompt and output tokens; 1 = off"))
    logit_bias: LogitBias = None
    response_format: ResponseFormatBody = None
    expert_budget: RequestBudget = None
    user: str | None = None

    @field_validator("expert_budget")
    @classmethod
    def _budget(cls, v):
        if v is not None and not isinstance(v, dict):  # an object: core.budget, per request
            parse_budget(v, BUDGET_FIELD)  # the syntax; E and the server's range per request
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v):
        return check_logit_bias(v, "logit_bias")

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, v):
        return check_response_format(v)

    @model_validator(mode="after")
    def _refuse_unimplemented(self):
        extra = self.model_extra or {}
        table = {**UNSUPPORTED["common"], **UNSUPPORTED[self.KIND]}
        for name, default in table.items():
            if name in extra and extra[name] is not None and extra[name] != default:
                raise ValueError(f"{name}: not supported by this server")
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stop) > 4:
            raise ValueError("stop: at most 4 stop sequences")
        return self


class CompletionRequest(_Sampling):
    KIND: ClassVar[str] = "completions"

    prompt: Prompt
    max_tokens: int | None = Field(16, ge=0)
    best_of: int | None = Field(None, ge=1, le=MAX_N, description=(
        "choices generated per prompt (>= n); the n with the highest cumulative logprob are "
        "returned; more than n cannot stream"))
    logprobs: int | None = Field(None, ge=0, le=5, description="top alternatives per token, 0..5")
    echo: bool = False

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

    @model_validator(mode="after")
    def _best_of(self):
        if self.best_of is not None:
            if self.best_of < self.n:
                raise ValueError(f"best_of: must be >= n ({self.n}), got {self.best_of}")
            if self.stream and self.best_of > self.n:
                raise ValueError("best_of: streaming is not supported when best_of > n (the "
                                 "choices are ranked once all have finished)")
        return self


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: str
    text: str | None = None


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str
    arguments: str  # JSON text, as OpenAI writes it


class ToolCallBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallBody] | None = None  # assistant turns that called tools
    tool_call_id: str | None = None  # tool turns: the call they answer


FUNCTION_NAME = "^[a-zA-Z0-9_-]{1,64}$"


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON Schema object")
    strict: bool | None = None


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str = Field(pattern=FUNCTION_NAME)


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Annotated[Literal["none", "auto", "required"] | NamedToolChoice | None, Field(
    description="auto (the default with tools): the model decides, calls parsed from its output; "
                "required / a named function: constrained by a grammar to calls")]


class ChatCompletionRequest(_Sampling):
    KIND: ClassVar[str] = "chat"

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20, description="needs logprobs: true")
    tools: list[ToolDef] | None = Field(None, max_length=128, description=(
        "functions the model may call (needs a chat template that renders tools; 400 otherwise)"))
    tool_choice: ToolChoice = None
    parallel_tool_calls: bool | None = Field(None, description="false: at most one call "
                                                                "(required / named)")

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, v):
        if v is None or v in ("none", "auto", "required"):
            return v
        if isinstance(v, dict) and v.get("type") == "function" and isinstance(
                v.get("function"), dict) and isinstance(v["function"].get("name"), str):
            return NamedToolChoice(type="function", function={"name": v["function"]["name"]})
        raise ValueError('tool_choice: must be "none", "auto", "required" or {"type": '
                         '"function", "function": {"name": ...}}')

    @model_validator(mode="after")
    def _tools(self):
        if self.top_logprobs is not None and self.top_logprobs > 0 and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs: true")
        tools = self.tools or []
        names = [t.function.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError("tools: function names must be unique")
        choice = self.tool_choice
        if choice not in (None, "none") and not tools:
            raise ValueError("tool_choice: only allowed when tools are given")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice: no tool named {choice.function.name!r} in tools")
        if choice not in (None, "none", "auto") and self.response_format is not None \
                and self.response_format.get("type") != "text":
            raise ValueError("tool_choice: 'required' or a named function cannot be combined "
                             "with response_format (both constrain the output)")
        return self


# ---- responses ------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class BoundedBudget(BaseModel):
    max_error: float  # the bound on the predicted relative removal error per MoE layer
    max_experts: int  # its cap: experts per layer per step


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # the applied request budget: "dense", experts per layer per step, or the bound with its cap
    expert_budget: int | str | BoundedBudget
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


class ToolCallFunction(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = []


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int  # the call's position in the choice's tool_calls
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None


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

"""Bodies of the vLLM / SGLang native routes: /tokenize, /detokenize (vLLM's shapes, SGLang's list
forms too) and SGLang's /generate (GenerateReqInput's fields that this server serves)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from base_sglang.core.budget import BUDGET_FIELD, parse_budget
from base_sglang.protocol import INT64_MAX, MAX_LOGPROBS, MAX_N
from base_sglang.server.schemas import (
    SEED_MAX,
    SEED_MIN,
    Budget,
    ChatMessage,
    Finite,
    LogitBias,
    ToolDef,
    check_logit_bias,
)


def exactly_one(a: str, b: str) -> dict:
    """JSON Schema: exactly one of the properties a and b is present and not null."""
    def only(x, y):
        return {"required": [x], "properties": {x: {"not": {"type": "null"}}, y: {"type": "null"}}}

    return {"oneOf": [only(a, b), only(b, a)]}


class TokenizeRequest(BaseModel):
    """vLLM's TokenizeCompletionRequest / TokenizeChatRequest in one (SGLang's shape): exactly one
    of prompt (a string, or a list of strings as SGLang takes) or messages."""

    model_config = ConfigDict(extra="ignore", strict=True,
                              json_schema_extra=exactly_one("prompt", "messages"))
    model: str | None = None
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    tools: list[ToolDef] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = Field(None, description=(
        "default true for prompt, false for messages (the chat template adds them), as vLLM"))
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("prompt: send exactly one of prompt or messages")
        return self


class TokenizeResponse(BaseModel):
    count: int | list[int]
    max_model_len: int
    tokens: list[int] | list[list[int]]
    token_strs: list[str] | list[list[str]] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    tokens: list[int] | list[list[int]]

    @field_validator("tokens")
    @classmethod
    def _ids(cls, v):
        flat = [t for x in v for t in (x if isinstance(x, list) else [x])]
        if any(t < 0 for t in flat):
            raise ValueError("tokens: token ids are integers >= 0")
        return v


class DetokenizeResponse(BaseModel):
    prompt: str | list[str]  # vLLM's name
    text: str | list[str]  # SGLang's name for the same text


class CustomParams(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    expert_budget: Budget = None  # what the SGLang plugin reads from custom_params

    @field_validator("expert_budget")
    @classmethod
    def _budget(cls, v):
        if v is not None:
            parse_budget(v, BUDGET_FIELD)
        return v


class GenerateSamplingParams(BaseModel):
    """SGLang's sampling_params (sglang.srt.sampling.sampling_params.SamplingParams) that this
    server implements, with SGLang's defaults and ranges; its grammar fields other than
    json_schema (regex, ebnf, structural_tag) are refused by name."""

    model_config = ConfigDict(extra="allow", strict=True)
    UNSUPPORTED: ClassVar[dict] = {"regex": None, "ebnf": None, "structural_tag": None,
                                   "stop_regex": None, "beam_width": None, "watermark": None}

    max_new_tokens: int | None = Field(128, ge=0)
    min_new_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0.0, **Finite)
    top_p: float | None = Field(None, gt=0.0, le=1.0, **Finite)
    top_k: int | None = Field(None, ge=-1, le=INT64_MAX)
    min_p: float | None = Field(None, ge=0.0, le=1.0, **Finite)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, **Finite)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, **Finite)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0, **Finite)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(None, max_length=256)
    ignore_eos: bool | None = None
    n: int | None = Field(None, ge=1, le=MAX_N)
    json_schema: str | None = Field(None, description="a JSON Schema as JSON text")
    logit_bias: LogitBias = None
    sampling_seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    skip_special_tokens: Literal[True] | None = None
    custom_params: CustomParams | None = None

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v):
        return check_logit_bias(v, "sampling_params.logit_bias")

    @model_validator(mode="after")
    def _refuse(self):
        for name in self.UNSUPPORTED:
            if (self.model_extra or {}).get(name) is not None:
                raise ValueError(f"sampling_params.{name}: not supported by this server")
        if any(t < 0 for t in self.stop_token_ids or []):
            raise ValueError("sampling_params.stop_token_ids: token ids are integers >= 0")
        return self


class GenerateRequest(BaseModel):
    """SGLang's /generate body (GenerateReqInput): one of text or input_ids (one prompt or a
    batch), one sampling_params object for all of them, stream, logprobs."""

    model_config = ConfigDict(extra="allow", strict=True,
                              json_schema_extra=exactly_one("text", "input_ids"))
    UNSUPPORTED: ClassVar[tuple] = ("image_data", "audio_data", "video_data", "lora_path",
                                    "session_params", "return_hidden_states",
                                    "return_routed_experts", "custom_logit_processor")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = Field(0, ge=0, le=MAX_LOGPROBS)
    logprob_start_len: int = Field(-1, ge=-1, description=(
        "-1: logprobs of the output tokens only; 0: of the prompt tokens too"))
    rid: str | None = None
    model: Any = None  # a router's field; ignored as SGLang ignores it

    @model_validator(mode="after")
    def _check(self):
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("text: send exactly one of text or input_ids")
        for name in self.UNSUPPORTED:
            if (self.model_extra or {}).get(name) not in (None, False):
                raise ValueError(f"{name}: not supported by this server")
        if self.logprob_start_len > 0:
            raise ValueError("logprob_start_len: only -1 (output tokens) and 0 (prompt too) "
                             "are supported")
        return self

    @property
    def expert_budget(self):
        custom = self.sampling_params.custom_params
        return None if custom is None else custom.expert_budget

    @property
    def is_batch(self) -> bool:
        x = self.text if self.text is not None else self.input_ids
        return isinstance(x, list) and bool(x) and isinstance(x[0], (str, list))

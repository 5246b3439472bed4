"""The contract between the HTTP server and its serving backends (native engine, SGLang).

The server builds a `SamplingParams` and a budget (an int in 1..E, E = dense, and an optional
error bound; see core.budget.resolve_request_budget) for each request and hands them to a
`Backend`, which streams `RequestOutput` deltas back. Neither backend imports the other; both
import this module.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit (0..20); completions `logprobs` shares it
MAX_N = 128  # OpenAI's limit on n (and on best_of here)
INT64_MAX = 2**63 - 1
SEED_STRIDE = 0x9E3779B97F4A7C15  # choice i of a seeded request uses seed + i * stride (mod 2**64)
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # response_format json_object, as SGLang maps it
SAMPLING_EPS = 1e-5  # temperatures below this are greedy (dividing logits by them overflows)
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


@dataclass(frozen=True)
class ResponseFormat:
    """Constrained decoding: the output must be JSON (json_object) or JSON valid against a schema.

    `schema` is the JSON Schema as compact JSON text, also the grammar cache key (key order is
    kept: properties are generated in the schema's order); build it with
    ResponseFormat.create(type, schema) from a dict or a JSON string.
    """

    type: str  # "json_object" | "json_schema"
    schema: str | None = None

    @classmethod
    def create(cls, type: str, schema: dict | str | None = None) -> ResponseFormat | None:
        """None for type "text" (no constraint); ValueError "response_format: ..." otherwise."""
        if type not in RESPONSE_FORMATS:
            raise ValueError(f"response_format: type must be one of {RESPONSE_FORMATS}, got {type!r}")
        if type == "text":
            return None
        if type == "json_object":
            return cls("json_object", None)
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise ValueError(f"response_format: the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError("response_format: json_schema needs a JSON Schema object")
        return cls("json_schema", json.dumps(schema, separators=(",", ":"), ensure_ascii=False))

    @classmethod
    def from_openai(cls, obj) -> ResponseFormat | None:
        """OpenAI's `response_format` object: {"type": "text"}, {"type": "json_object"} or
        {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}."""
        if obj is None:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
            raise ValueError("response_format: must be an object with a string `type`")
        if obj["type"] != "json_schema":
            return cls.create(obj["type"])
        spec = obj.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ValueError("response_format: json_schema needs {\"json_schema\": {\"name\": ..., "
                             "\"schema\": {...}}}")
        return cls.create("json_schema", spec["schema"])

    def __post_init__(self):
        if self.type not in ("json_object", "json_schema"):
            raise ValueError(f"response_format: type must be json_object or json_schema, got "
                             f"{self.type!r}")
        if (self.type == "json_schema") != (self.schema is not None):
            raise ValueError("response_format: json_schema needs a schema, json_object takes none")


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 (or below SAMPLING_EPS) is greedy; top_k <= 0, top_p = 1, min_p = 0,
    repetition_penalty = 1 and the zero penalties switch those off.

    n               : choices returned (1..MAX_N); they share one dense prefill of the prompt.
    best_of         : None (= n), or choices generated (n..MAX_N); the n with the highest
                      cumulative logprob are returned, all at once when the last one finishes.
    logprobs        : None, or the number of top alternatives returned with each generated token.
    prompt_logprobs : None, or the same for the prompt tokens (completions `echo` + `logprobs`).
    stop            : strings that end the output (not included in it).
    stop_token_ids  : token ids that end the output (kept in token_ids, and in the text unless
                      they are special tokens, as vLLM documents it).
    seed            : per-request generator (choice i of n uses a seed derived from it); None uses
                      the engine's global one.
    ignore_eos      : EOS does not end the output (max_tokens, stop strings and stop_token_ids do).
    min_tokens      : EOS and stop_token_ids are masked until this many tokens were generated.
    logit_bias      : token id -> bias in [-100, 100] added to its logit (OpenAI); -100 bans it.
    presence_penalty, frequency_penalty : OpenAI's, in [-2, 2], over the generated tokens:
                      logit -= frequency * count + presence * (count > 0).
    repetition_penalty : vLLM's / transformers', in (0, 2], over prompt and generated tokens:
                      a positive logit is divided by it, a negative one multiplied.
    min_p           : tokens with probability below min_p * (the top probability) are dropped.
    response_format : None, or constrained decoding (JSON object / JSON Schema).

    Every logprob reported is the model's, before any of these (as vLLM's default raw logprobs).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    ignore_eos: bool = False
    n: int = 1
    best_of: int | None = None
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    logit_bias: dict[int, float] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    response_format: ResponseFormat | None = None

    def __post_init__(self):
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if self.logit_bias is not None:
            object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        if not self.temperature >= 0.0:  # also rejects NaN
            raise ValueError(f"temperature: must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        _int(self, "top_k", lo=None, hi=INT64_MAX)  # a torch int64 tensor in the sampler
        _int(self, "max_tokens", lo=0)
        if any((not isinstance(s, str)) or s == "" for s in self.stop):
            raise ValueError("stop: every stop sequence must be a non-empty string")
        if self.seed is not None:
            _int(self, "seed", lo=-(2**63), hi=2**64 - 1)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _int(self, name, lo=0, hi=MAX_LOGPROBS)
        self._check_choices()
        _int(self, "min_tokens", lo=0, hi=self.max_tokens)
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids: every entry must be a token id (an integer >= 0)")
        for name, lo, hi in (("presence_penalty", -2.0, 2.0), ("frequency_penalty", -2.0, 2.0),
                             ("min_p", 0.0, 1.0)):
            if not lo <= getattr(self, name) <= hi:  # also rejects NaN
                raise ValueError(f"{name}: must be in [{lo:g}, {hi:g}], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty: must be in (0, 2], got {self.repetition_penalty}")
        if self.response_format is not None and not isinstance(self.response_format, ResponseFormat):
            raise ValueError("response_format: must be a ResponseFormat (ResponseFormat.create)")

    def _check_choices(self) -> None:
        _int(self, "n", lo=1, hi=MAX_N)
        if self.best_of is not None:
            _int(self, "best_of", lo=self.n, hi=MAX_N)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    @property
    def num_sequences(self) -> int:
        """Sequences generated for the request (best_of, else n)."""
        return self.best_of or self.n

    @property
    def holds_outputs(self) -> bool:
        """best_of > n: choices are ranked at the end, so nothing streams before that."""
        return self.num_sequences > self.n

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)


def _int(params, name: str, lo: int | None, hi: int | None = None) -> None:
    v = getattr(params, name)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name}: must be an integer, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}: must be {rng}, got {v}")


def _logit_bias(bias) -> dict[int, float]:
    """{token id (int, or its decimal string as JSON sends it): bias in [-100, 100]}."""
    if not isinstance(bias, dict):
        raise ValueError("logit_bias: must be a map of token id -> bias")
    out = {}
    for key, value in bias.items():
        try:
            tok = int(key) if not isinstance(key, (bool, float)) else None
        except (TypeError, ValueError):
            tok = None
        if tok is None or tok < 0:
            raise ValueError(f"logit_bias: keys must be token ids (integers >= 0), got {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not -100.0 <= value <= 100.0:
            raise ValueError(f"logit_bias: bias of token {tok} must be a number in [-100, 100], "
                             f"got {value!r}")
        out[tok] = float(value)
    return out


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: dict[int, float]  # alternative token id -> logprob (includes the top ones, best first)


@dataclass
class RequestOutput:
    """What one engine step produced for one choice of a request (deltas since its previous
    output). `finished` and `finish_reason` are the choice's; the request is over when each of
    its n choices has sent finished=True."""

    request_id: str
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None
    prompt_logprobs: list[TokenLogprob | None] | None  # once, with the first output; [0] is None
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"
    num_prompt_tokens: int
    num_output_tokens: int
    budget: int
    experts_per_layer: float | None  # mean distinct experts executed per MoE layer, decode steps
    experts_per_layer_routed: float | None  # the same without selection (the dense union)
    error: str | None = None
    queue_time_s: float | None = None  # from arrival to the start of the request's prefill
    index: int = 0  # the choice, 0..n-1
    cumulative_logprob: float | None = None  # sum of the choice's token logprobs (best_of ranks)


SHUTTING_DOWN = "the server is shutting down; retry on another replica"  # error of aborted requests


class QueueFull(RuntimeError):
    """The backend cannot take the request now (its waiting queue is full): HTTP 503."""


class Backend(Protocol):
    """What the server needs from a serving backend.

    generate() raises ValueError ("field: message" -> HTTP 400 naming the field) or QueueFull
    (-> 503) before the first output, then yields RequestOutput deltas, each tagged with its
    choice `index` (0..params.n-1), until every choice has sent one with finished=True (with
    best_of > n each choice comes as one finished output, ranked, after all were generated;
    a failed request ends every choice with finish_reason "error"). Leaving the iterator early (client gone) aborts the request and frees its batch
    slot. A request that failed inside the backend ends with finish_reason "error" and `error` set.
    stats() -> {"num_requests_running": int, "num_requests_waiting": int,
                "engine": engine.stats.EngineStats | None}  (read by /metrics).
    """

    name: str  # model id served at /v1/models and checked against each request's `model`
    num_experts: int  # E, routed experts per MoE layer: budgets are 1..E, E = dense
    max_model_len: int  # prompt + output tokens per request
    policy: str  # the selection policy in decode steps
    tokenizer: Any  # a transformers tokenizer (encode / decode / apply_chat_template)
    capacity: int | None  # requests it can hold at once (running + waiting); None = unbounded

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    # budget: an int 1..E; max_error: an error-targeted bound in [0, 1] with budget as its cap
    # (core.budget.resolve_request_budget), passed only when set; a backend without bounds
    # raises ValueError "expert_budget.max_error: ..."
    def generate(self, prompt_ids: list[int], params: SamplingParams, budget: int,
                 request_id: str, max_error: float | None = None
                 ) -> AsyncIterator[RequestOutput]: ...
    def abort(self, request_id: str) -> None: ...
    def abort_all(self, error: str) -> int: ...  # end every live request with `error`; -> count
    # compile params.response_format ahead of generate (blocking: called in a worker thread);
    # ValueError "response_format: ..." if the grammar library rejects it
    def compile_grammar(self, params: SamplingParams) -> None: ...
    def error_status(self, error: str) -> int: ...  # 400 if a failed output's error is the
    # request's own doing (e.g. its constraints leave no token to sample), else 500
    def stats(self) -> dict: ...
    def describe(self) -> dict: ...  # what it serves and how (logged at start-up)

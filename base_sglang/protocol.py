"""The contract between the HTTP server and its serving backends (native engine, SGLang).

The server builds a `SamplingParams` and a budget (an int in 1..E, E = dense; see
core.budget.resolve_budget) for each request and hands them to a `Backend`, which streams
`RequestOutput` deltas back. Neither backend imports the other; both import this module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

MAX_LOGPROBS = 20
SAMPLING_EPS = 1e-5  # temperatures below this are greedy (dividing logits by them overflows)


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 (or below SAMPLING_EPS) is greedy; top_k <= 0 and top_p = 1 switch those
    filters off.

    logprobs        : None, or the number of top alternatives returned with each generated token.
    prompt_logprobs : None, or the same for the prompt tokens (completions `echo` + `logprobs`).
    stop            : strings that end the output (not included in it).
    seed            : per-request generator; None uses the engine's global one.
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

    def __post_init__(self):
        object.__setattr__(self, "stop", tuple(self.stop))
        if not self.temperature >= 0.0:  # also rejects NaN
            raise ValueError(f"temperature: must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens: must be >= 0, got {self.max_tokens}")
        if any((not isinstance(s, str)) or s == "" for s in self.stop):
            raise ValueError("stop: every stop sequence must be a non-empty string")
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and not 0 <= n <= MAX_LOGPROBS:
                raise ValueError(f"{name}: must be in [0, {MAX_LOGPROBS}], got {n}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: dict[int, float]  # alternative token id -> logprob (includes the top ones, best first)


@dataclass
class RequestOutput:
    """What one engine step produced for one request (deltas since the previous output)."""

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


SHUTTING_DOWN = "the server is shutting down; retry on another replica"  # error of aborted requests


class QueueFull(RuntimeError):
    """The backend cannot take the request now (its waiting queue is full): HTTP 503."""


class Backend(Protocol):
    """What the server needs from a serving backend.

    generate() raises ValueError ("field: message" -> HTTP 400 naming the field) or QueueFull
    (-> 503) before the first output, then yields RequestOutput deltas until one has
    finished=True. Leaving the iterator early (client gone) aborts the request and frees its batch
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
    def generate(self, prompt_ids: list[int], params: SamplingParams, budget: int,
                 request_id: str) -> AsyncIterator[RequestOutput]: ...
    def abort(self, request_id: str) -> None: ...
    def abort_all(self, error: str) -> int: ...  # end every live request with `error`; -> count
    def stats(self) -> dict: ...
    def describe(self) -> dict: ...  # what it serves and how (logged at start-up)

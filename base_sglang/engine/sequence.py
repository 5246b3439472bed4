"""One request inside the engine: its tokens, sampling state, budget, KV row and statistics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum, auto

import torch

from .detokenizer import Detokenizer
from .sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


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


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    budget: int  # experts per MoE layer per decode step; >= E means dense
    detokenizer: Detokenizer
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    num_decode_steps: int = 0
    experts_executed_sum: float = 0.0  # sum over decode steps of mean-over-layers experts executed
    experts_routed_sum: float = 0.0
    arrival_time: float = field(default_factory=time.monotonic)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def finish(self, reason: str) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason

    def mean_experts(self) -> tuple[float | None, float | None]:
        if self.num_decode_steps == 0:
            return None, None
        n = self.num_decode_steps
        return self.experts_executed_sum / n, self.experts_routed_sum / n

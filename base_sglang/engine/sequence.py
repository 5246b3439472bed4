"""One request inside the engine: its tokens, sampling state, budget, KV row and statistics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum, auto

import torch

from ..protocol import SamplingParams, TokenLogprob
from .detokenizer import Detokenizer


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


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
    scheduled_time: float | None = None  # when its prefill began

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

"""One request inside the engine: its tokens, sampling state, budget, KV row and statistics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any

import torch

from ..protocol import SamplingParams, TokenLogprob
from .detokenizer import Detokenizer


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass(eq=False)
class Sequence:
    """One choice of a request: a request with n (or best_of) choices has that many Sequences,
    in one `group` (the same list object in each), prefilled once and decoded as separate rows."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    budget: int  # experts per MoE layer per decode step; >= E means dense (a bounded row's cap)
    detokenizer: Detokenizer
    generator: torch.Generator | None = None
    index: int = 0  # choice index within the request
    group: list[Sequence] = field(default_factory=list, repr=False)  # every choice of the request, by index
    grammar: Any = None  # engine.grammar.Grammar (constrained decoding) or None
    max_error: float | None = None  # error-targeted budget: bound in [0, 1] (core.error_budget)
    output_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    num_decode_steps: int = 0
    experts_executed_sum: float = 0.0  # sum over decode steps of mean-over-layers experts executed
    experts_routed_sum: float = 0.0
    cumulative_logprob: float = 0.0  # model logprobs of the output tokens, summed
    held_logprobs: list[TokenLogprob] = field(default_factory=list)  # best_of > n: all of them
    arrival_time: float = field(default_factory=time.monotonic)
    scheduled_time: float | None = None  # when its prefill began

    def __post_init__(self):
        if self not in self.group:  # identity (eq=False): the first choice starts the group
            self.group.append(self)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def is_group_finished(self) -> bool:
        return all(s.is_finished for s in self.group)

    def finish(self, reason: str) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason

    def mean_experts(self) -> tuple[float | None, float | None]:
        if self.num_decode_steps == 0:
            return None, None
        n = self.num_decode_steps
        return self.experts_executed_sum / n, self.experts_routed_sum / n

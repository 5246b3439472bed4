"""Per-step statistics and their running totals (read by /metrics and the tests)."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepStats:
    is_prefill: bool
    batch_size: int  # requests in the step
    num_tokens: int  # tokens forwarded (prefill: prompt tokens without padding)
    duration_s: float
    budgets: tuple[int, ...] = ()  # decode: each row's budget, capped at E (E = dense; bounded: cap)
    batch_budget: int | None = None  # decode: max over rows (E = dense; bounded rows: their caps,
    # an upper bound on the M their bounds pick per layer; experts_executed is what ran)
    experts_routed: tuple[int, ...] = ()  # decode: distinct experts routed per MoE layer (before)
    experts_executed: tuple[int, ...] = ()  # decode: distinct experts executed per MoE layer (after)
    removed_cost: float = 0.0  # decode: predicted removal cost of the dropped experts, all layers

    @property
    def mean_executed(self) -> float:
        return sum(self.experts_executed) / max(len(self.experts_executed), 1)

    @property
    def mean_routed(self) -> float:
        return sum(self.experts_routed) / max(len(self.experts_routed), 1)


@dataclass
class EngineStats:
    num_moe_layers: int
    num_experts: int | None = None  # E: batch budgets run 1..E (E = dense)
    history: int = 4096
    num_prefill_steps: int = 0
    num_decode_steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    removed_cost_sum: float = 0.0
    decode_seconds: float = 0.0
    batch_sizes: Counter = field(default_factory=Counter)  # decode batch size -> steps
    batch_budgets: Counter = field(default_factory=Counter)  # batch budget -> decode steps
    executed_sum: list[int] = field(default_factory=list)  # per MoE layer, over decode steps
    routed_sum: list[int] = field(default_factory=list)
    recent: deque = field(default_factory=deque)

    def __post_init__(self):
        self.executed_sum = [0] * self.num_moe_layers
        self.routed_sum = [0] * self.num_moe_layers
        self.recent = deque(maxlen=self.history)

    def record(self, step: StepStats) -> None:
        self.recent.append(step)
        if step.is_prefill:
            self.num_prefill_steps += 1
            self.prefill_tokens += step.num_tokens
            return
        self.num_decode_steps += 1
        self.decode_tokens += step.num_tokens
        self.decode_seconds += step.duration_s
        self.batch_sizes[step.batch_size] += 1
        self.batch_budgets[step.batch_budget] += 1
        self.removed_cost_sum += step.removed_cost
        for j, (n_exec, n_routed) in enumerate(zip(step.experts_executed, step.experts_routed)):
            self.executed_sum[j] += n_exec
            self.routed_sum[j] += n_routed

    def decode_steps(self) -> list[StepStats]:
        return [s for s in self.recent if not s.is_prefill]

"""Prometheus text exposition for /metrics: request counters here, step counters from the engine."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
PREFIX = "base"


@dataclass
class Metrics:
    requests: Counter = field(default_factory=Counter)  # (endpoint, status) -> n
    budgets: Counter = field(default_factory=Counter)  # applied budget label -> n
    finish_reasons: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    latency_sum: float = 0.0
    latency_count: int = 0

    def observe_request(self, endpoint: str, status: int) -> None:
        self.requests[(endpoint, str(status))] += 1

    def observe_result(self, budget_label, prompt_tokens: int, completion_tokens: int,
                       latency_s: float, finish_reason: str | None) -> None:
        self.budgets[str(budget_label)] += 1
        self.finish_reasons[str(finish_reason)] += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.latency_sum += latency_s
        self.latency_count += 1
        for i, b in enumerate(LATENCY_BUCKETS):
            if latency_s <= b:
                self.latency_buckets[i] += 1

    def render(self, backend_stats: dict) -> str:
        out: list[str] = []
        metric = _Writer(out)
        metric("requests_total", "counter", "HTTP requests by endpoint and status",
               {(("endpoint", e), ("status", s)): n for (e, s), n in self.requests.items()})
        metric("request_budget_total", "counter", "finished requests by applied expert budget",
               {(("budget", b),): n for b, n in self.budgets.items()})
        metric("request_finish_total", "counter", "finished requests by finish reason",
               {(("reason", r),): n for r, n in self.finish_reasons.items()})
        metric("prompt_tokens_total", "counter", "prompt tokens of finished requests",
               {(): self.prompt_tokens})
        metric("generation_tokens_total", "counter", "generated tokens of finished requests",
               {(): self.completion_tokens})
        cum = {(("le", str(b)),): n for b, n in zip(LATENCY_BUCKETS, self.latency_buckets)}
        cum[(("le", "+Inf"),)] = self.latency_count
        metric.histogram("request_latency_seconds", "end-to-end request latency", cum,
                         self.latency_sum, self.latency_count)
        metric("num_requests_running", "gauge", "requests in the decode batch",
               {(): backend_stats.get("num_requests_running", 0)})
        metric("num_requests_waiting", "gauge", "requests in the waiting queue",
               {(): backend_stats.get("num_requests_waiting", 0)})
        eng = backend_stats.get("engine")
        if eng is not None:
            _engine_metrics(metric, eng)
        return "\n".join(out) + "\n"


def _engine_metrics(metric, eng) -> None:
    metric("prefill_steps_total", "counter", "dense prefill forwards", {(): eng.num_prefill_steps})
    metric("decode_steps_total", "counter", "decode forwards", {(): eng.num_decode_steps})
    metric("prefill_step_tokens_total", "counter", "prompt tokens prefilled",
           {(): eng.prefill_tokens})
    metric("decode_step_tokens_total", "counter", "tokens decoded", {(): eng.decode_tokens})
    metric("decode_seconds_total", "counter", "time spent in decode steps",
           {(): round(eng.decode_seconds, 6)})
    metric("decode_batch_size_steps_total", "counter", "decode steps by batch size",
           {(("batch_size", str(b)),): n for b, n in sorted(eng.batch_sizes.items())})
    metric("decode_batch_budget_steps_total", "counter",
           "decode steps by batch budget (max request budget in the batch; E = dense)",
           {(("budget", str(b)),): n for b, n in sorted(eng.batch_budgets.items())})
    metric("experts_executed_total", "counter",
           "distinct experts executed per MoE layer, summed over decode steps",
           {(("layer", str(j)),): n for j, n in enumerate(eng.executed_sum)})
    metric("experts_routed_total", "counter",
           "distinct experts the router chose per MoE layer (before selection), summed over steps",
           {(("layer", str(j)),): n for j, n in enumerate(eng.routed_sum)})
    metric("predicted_removed_cost_total", "counter",
           "predicted removal cost of the experts not executed, all layers and steps",
           {(): round(eng.removed_cost_sum, 6)})


class _Writer:
    def __init__(self, out: list[str]):
        self.out = out

    def __call__(self, name: str, kind: str, help_text: str, samples: dict) -> None:
        full = f"{PREFIX}_{name}"
        self.out += [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}"]
        self.out += [f"{full}{_labels(k)} {v}" for k, v in samples.items()]

    def histogram(self, name, help_text, buckets: dict, total: float, count: int) -> None:
        full = f"{PREFIX}_{name}"
        self.out += [f"# HELP {full} {help_text}", f"# TYPE {full} histogram"]
        self.out += [f"{full}_bucket{_labels(k)} {v}" for k, v in buckets.items()]
        self.out += [f"{full}_sum {round(total, 6)}", f"{full}_count {count}"]


def _labels(pairs) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"

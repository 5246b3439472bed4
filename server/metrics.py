"""Prometheus text exposition for /metrics: the HTTP layer's counters and histograms, the engine's.

Request accounting (the invariant the load test checks): every request on a generation route gets
exactly one base_requests_total{endpoint,status}; every request the backend admitted ends exactly
once in base_request_finish_total{reason} (stop, length, abort, error). So, per generation route,
requests = admitted + rejected, with admitted = the finish total and rejected = the 4xx answers
other than 499 (400, 401, 404, 413) and 503.
Budgets are labelled as clients write them: "dense" or the number (core.budget.budget_label);
every error-targeted request is labelled "max_error" (core.budget.BOUNDED_LABEL), whatever its bound.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

PREFIX = "base"
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative
    total: float = 0.0
    count: int = 0

    def __post_init__(self):
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float, times: int = 1) -> None:
        self.total += value * times
        self.count += times
        for i, b in enumerate(self.buckets):
            if value <= b:
                self.counts[i] += times
                break

    def cumulative(self) -> list[int]:
        out, run = [], 0
        for n in self.counts:
            run += n
            out.append(run)
        return out


@dataclass
class Metrics:
    responses: Counter = field(default_factory=Counter)  # (endpoint, status) -> n
    finishes: Counter = field(default_factory=Counter)  # reason -> n (admitted requests)
    budgets: Counter = field(default_factory=Counter)  # applied budget label -> n (admitted)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(QUEUE_BUCKETS))

    def observe_response(self, endpoint: str, status: int) -> None:
        self.responses[(endpoint, str(status))] += 1

    def observe_finish(self, reason: str, budget_label, prompt_tokens: int,
                       completion_tokens: int, latency_s: float) -> None:
        self.finishes[reason if reason in FINISH_REASONS else "error"] += 1
        self.budgets[str(budget_label)] += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.latency.observe(latency_s)

    def render(self, backend_stats: dict) -> str:
        out: list[str] = []
        m = _Writer(out)
        m("requests_total", "counter", "HTTP responses by endpoint and status",
          {(("endpoint", e), ("status", s)): n for (e, s), n in sorted(self.responses.items())})
        m("request_finish_total", "counter",
          "admitted requests by how they ended (stop, length, abort = client gone, error)",
          {(("reason", r),): self.finishes.get(r, 0) for r in FINISH_REASONS})
        m("request_budget_total", "counter", "admitted requests by applied expert budget",
          {(("budget", b),): n for b, n in sorted(self.budgets.items())})
        m("prompt_tokens_total", "counter", "prompt tokens of admitted requests",
          {(): self.prompt_tokens})
        m("generation_tokens_total", "counter", "tokens generated for admitted requests",
          {(): self.completion_tokens})
        m.histogram("request_latency_seconds", "end-to-end latency of admitted requests",
                    self.latency)
        m.histogram("time_to_first_token_seconds", "request arrival to its first output token",
                    self.ttft)
        m.histogram("inter_token_latency_seconds", "time between a request's output tokens",
                    self.itl)
        m.histogram("request_queue_time_seconds", "time a request waited before its prefill",
                    self.queue)
        m("num_requests_running", "gauge", "requests in the decode batch",
          {(): backend_stats.get("num_requests_running", 0)})
        m("num_requests_waiting", "gauge", "requests in the waiting queue",
          {(): backend_stats.get("num_requests_waiting", 0)})
        eng = backend_stats.get("engine")
        if eng is not None:
            _engine_metrics(m, eng)
        return "\n".join(out) + "\n"


def _engine_metrics(m, eng) -> None:
    m("prefill_steps_total", "counter", "dense prefill forwards", {(): eng.num_prefill_steps})
    m("decode_steps_total", "counter", "decode forwards", {(): eng.num_decode_steps})
    m("prefill_step_tokens_total", "counter", "prompt tokens prefilled", {(): eng.prefill_tokens})
    m("decode_step_tokens_total", "counter", "tokens decoded", {(): eng.decode_tokens})
    m("decode_seconds_total", "counter", "time spent in decode steps",
      {(): round(eng.decode_seconds, 6)})
    m.histogram("decode_batch_size", "requests per decode step",
                _from_counts(eng.batch_sizes, _powers_of_two(max(eng.batch_sizes, default=1))))
    E = getattr(eng, "num_experts", None) or max(eng.batch_budgets, default=1)
    m.histogram("decode_batch_budget",
                "batch budget of each decode step (the largest request budget; E = dense)",
                _from_counts(eng.batch_budgets, _powers_of_two(E, last=E)))
    m("experts_executed_total", "counter",
      "distinct experts executed per MoE layer, summed over decode steps",
      {(("layer", str(j)),): n for j, n in enumerate(eng.executed_sum)})
    m("experts_routed_total", "counter",
      "distinct experts the router chose per MoE layer (before selection), summed over steps",
      {(("layer", str(j)),): n for j, n in enumerate(eng.routed_sum)})
    m("predicted_removed_cost_total", "counter",
      "predicted removal cost of the experts not executed, all layers and steps",
      {(): round(eng.removed_cost_sum, 6)})


def _powers_of_two(top: int, last: int | None = None) -> tuple[float, ...]:
    out, b = [], 1
    while b < top:
        out.append(b)
        b *= 2
    out.append(last if last is not None else b)
    return tuple(sorted(set(out)))


def _from_counts(counts: Counter, buckets: tuple[float, ...]) -> Histogram:
    """A histogram of integer observations kept as value -> count."""
    h = Histogram(buckets)
    for value, n in counts.items():
        h.observe(value, n)
    return h


class _Writer:
    def __init__(self, out: list[str]):
        self.out = out

    def __call__(self, name: str, kind: str, help_text: str, samples: dict) -> None:
        full = f"{PREFIX}_{name}"
        self.out += [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}"]
        self.out += [f"{full}{_labels(k)} {v}" for k, v in samples.items()]

    def histogram(self, name: str, help_text: str, h: Histogram) -> None:
        full = f"{PREFIX}_{name}"
        self.out += [f"# HELP {full} {help_text}", f"# TYPE {full} histogram"]
        self.out += [f'{full}_bucket{{le="{_num(b)}"}} {n}'
                     for b, n in zip(h.buckets, h.cumulative())]
        self.out += [f'{full}_bucket{{le="+Inf"}} {h.count}', f"{full}_sum {round(h.total, 6)}",
                     f"{full}_count {h.count}"]


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _labels(pairs) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"

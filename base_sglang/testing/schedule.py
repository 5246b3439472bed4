"""A seeded random request schedule and a driver that serves it on an LLMEngine, step by step.

The schedule mixes what a serving engine meets in one afternoon: prompts of 1..300 tokens cut from
held-out text, budgets 1..E and "dense" in the same batches, greedy and sampled requests (temperature,
top-p, top-k, seeds), stop strings, max_tokens from 1 up, requests arriving while others decode, and
requests aborted part-way (a client that went away). The same schedule drives the HTTP test (by
arrival time instead of engine steps), so both paths see the same traffic.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

HELDOUT = Path(__file__).resolve().parent.parent / "data" / "heldout.txt"
STOPS = ("\n", " the", "(", ":", "\n\n", ".")


@dataclass(frozen=True)
class ScheduledRequest:
    index: int
    prompt_ids: list[int]
    budget: int | str  # 1..E or "dense"
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop: tuple[str, ...]
    seed: int | None
    logprobs: int | None
    arrival: int  # engine steps (or ticks over HTTP) after the start
    abort_after: int | None  # the client leaves after this many outputs (None: stays)
    stream: bool  # over HTTP: streaming or not

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def token_pool(tokenizer, max_chars: int = 400_000) -> list[int]:
    """Token ids of the first max_chars of the packaged held-out text (prompt material)."""
    return tokenizer.encode(HELDOUT.read_text(encoding="utf-8")[:max_chars])


def random_budget(rng: random.Random, num_experts: int, top_k: int) -> int | str:
    """Half of the budgets below top-k (where routing changes most), the rest above, E or dense."""
    r = rng.random()
    if r < 0.5:
        return rng.randint(1, max(1, top_k - 1))
    if r < 0.8:
        return rng.randint(min(top_k, num_experts), num_experts)
    return "dense" if r < 0.9 else num_experts


def random_schedule(pool: list[int], num_experts: int, top_k: int, num_requests: int = 200,
                    seed: int = 0, max_prompt: int = 300, max_tokens: int = 24,
                    abort_share: float = 0.1, arrival_span: int = 150) -> list[ScheduledRequest]:
    """num_requests requests over arrival_span steps; a fixed seed gives the same schedule."""
    rng = random.Random(seed)
    out = []
    for i in range(num_requests):
        n = rng.choice([1, 2, 3, rng.randint(1, 40), rng.randint(1, max_prompt)])
        start = rng.randrange(0, len(pool) - n)
        greedy = rng.random() < 0.35
        out.append(ScheduledRequest(
            index=i, prompt_ids=pool[start:start + n],
            budget=random_budget(rng, num_experts, top_k),
            temperature=0.0 if greedy else rng.choice([0.3, 0.7, 1.0, 1.5, 2.0]),
            top_p=rng.choice([1.0, 1.0, 0.9, 0.5, 0.05]),
            top_k=rng.choice([-1, -1, 1, 5, 50]),
            max_tokens=rng.choice([1, 2, rng.randint(1, max_tokens), max_tokens]),
            stop=tuple(rng.sample(STOPS, rng.choice([0, 0, 1, 2]))),
            seed=rng.choice([None, rng.randrange(2**31)]),
            logprobs=rng.choice([None, None, 0, 1, 5]),
            arrival=rng.randrange(arrival_span),
            abort_after=rng.randint(1, 4) if rng.random() < abort_share else None,
            stream=rng.random() < 0.5))
    return out


@dataclass
class Served:
    """What one scheduled request got back from the engine."""

    request: ScheduledRequest
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    num_outputs: int = 0
    finish_reason: str | None = None
    error: str | None = None


def sampling_params(req: ScheduledRequest):
    from base_sglang.engine import SamplingParams

    return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                          max_tokens=req.max_tokens, stop=req.stop, seed=req.seed,
                          logprobs=req.logprobs)


def serve_on_engine(engine, schedule: list[ScheduledRequest], max_steps: int = 100_000):
    """Add each request at its arrival step, abort the leavers, step until everything finished.

    Returns {index: Served}. Raises AssertionError if a step raises, a request gets output after
    it finished, or the engine is not idle when the schedule ends.
    """
    by_step: dict[int, list[ScheduledRequest]] = {}
    for req in schedule:
        by_step.setdefault(req.arrival, []).append(req)
    served = {req.index: Served(req) for req in schedule}
    rid_of = {}
    last_arrival = max(by_step) if by_step else 0
    for step in range(max_steps):
        for req in by_step.get(step, []):
            rid_of[engine.add_request(req.prompt_ids, sampling_params(req), req.budget,
                                      request_id=f"sched-{req.index}")] = req.index
        for out in engine.step():
            s = served[rid_of[out.request_id]]
            assert s.finish_reason is None, f"output after finish for request {s.request.index}"
            s.num_outputs += 1
            s.token_ids += out.token_ids
            s.logprobs += [lp.logprob for lp in out.logprobs or []]
            if out.finished:
                s.finish_reason, s.error = out.finish_reason, out.error
            elif s.request.abort_after is not None and s.num_outputs >= s.request.abort_after:
                final = engine.abort(out.request_id)
                if final is not None:
                    s.finish_reason, s.error = final.finish_reason, final.error
        if step >= last_arrival and not engine.has_unfinished():
            break
    assert not engine.has_unfinished(), "the schedule did not drain"
    return served


def check_served(served: dict[int, Served]) -> list[str]:
    """Everything a healthy engine guarantees for every request; returns the violations."""
    bad = []
    for s in served.values():
        req = s.request
        want = {"stop", "length"} | ({"abort"} if req.abort_after is not None else set())
        if s.error is not None or s.finish_reason not in want:
            bad.append(f"request {req.index}: finish {s.finish_reason!r}, error {s.error!r}")
        if not all(math.isfinite(x) for x in s.logprobs):
            bad.append(f"request {req.index}: non-finite logprob")
        if s.finish_reason == "length" and len(s.token_ids) != req.max_tokens:
            bad.append(f"request {req.index}: length finish after {len(s.token_ids)} of "
                       f"{req.max_tokens} tokens")
        if req.logprobs is not None and s.finish_reason in ("stop", "length") \
                and len(s.logprobs) != len(s.token_ids):
            bad.append(f"request {req.index}: {len(s.logprobs)} logprobs for "
                       f"{len(s.token_ids)} tokens")
    return bad

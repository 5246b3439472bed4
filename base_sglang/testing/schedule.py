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
    from base_sglang.protocol import SamplingParams

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
                for final in engine.abort(out.request_id):
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


# ---- over HTTP, with the official openai client -------------------------------------------------
@dataclass
class HttpServed:
    request: ScheduledRequest
    route: str  # "completions" | "chat"
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[float] = field(default_factory=list)
    status: int | None = None  # HTTP status of an error response (None: 200)
    error: str | None = None
    aborted: bool = False


async def serve_over_http(base_url: str, model: str, tokenizer, schedule: list[ScheduledRequest],
                          tick_s: float = 0.02, api_key: str = "unused") -> dict[int, HttpServed]:
    """Send every request at arrival * tick_s seconds through openai.AsyncOpenAI; the leavers
    close their stream after abort_after chunks (or time out, non-streaming). Never retries."""
    import asyncio

    import openai

    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0,
                                timeout=120)

    async def one(req: ScheduledRequest) -> HttpServed:
        rng = random.Random(req.index)
        route = "chat" if rng.random() < 0.3 else "completions"
        res = HttpServed(req, route)
        budget = {"expert_budget": req.budget}
        extra_headers, extra_body = ({"X-Expert-Budget": str(req.budget)}, {}) \
            if rng.random() < 0.5 else ({}, budget)
        extra_body |= {"top_k": req.top_k}
        kw = dict(model=model, max_tokens=req.max_tokens, temperature=req.temperature,
                  top_p=req.top_p, stop=list(req.stop) or None, seed=req.seed,
                  stream=req.stream, extra_headers=extra_headers, extra_body=extra_body)
        if route == "chat":
            kw["messages"] = [{"role": "user", "content": tokenizer.decode(req.prompt_ids)}]
            if req.logprobs is not None:
                kw |= {"logprobs": True, "top_logprobs": req.logprobs}
            call = client.chat.completions.create
        else:
            kw["prompt"] = req.prompt_ids
            kw["logprobs"] = req.logprobs
            call = client.completions.create
        if not req.stream and req.abort_after is not None:
            kw["timeout"] = 0.05 * req.abort_after  # the client gives up: a disconnect
        await asyncio.sleep(req.arrival * tick_s)
        try:
            out = await call(**kw)
            if req.stream:
                n = 0
                async for chunk in out:
                    n += 1
                    for choice in chunk.choices:
                        _take(res, route, choice, stream=True)
                    if req.abort_after is not None and n >= req.abort_after:
                        res.aborted = True
                        await out.close()
                        break
            else:
                _take(res, route, out.choices[0], stream=False)
        except openai.APIStatusError as exc:
            res.status, res.error = exc.status_code, str(exc)
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            res.aborted = req.abort_after is not None
            res.error = None if res.aborted else f"{type(exc).__name__}: {exc}"
        return res

    try:
        results = await asyncio.gather(*(one(r) for r in schedule))
    finally:
        await client.close()
    return {r.request.index: r for r in results}


def _take(res: HttpServed, route: str, choice, stream: bool) -> None:
    if route == "chat":
        res.text += (choice.delta.content if stream else choice.message.content) or ""
        if choice.logprobs is not None and choice.logprobs.content:
            res.logprobs += [t.logprob for t in choice.logprobs.content]
    else:
        res.text += choice.text or ""
        if choice.logprobs is not None and choice.logprobs.token_logprobs:
            res.logprobs += [x for x in choice.logprobs.token_logprobs if x is not None]
    if choice.finish_reason is not None:
        res.finish_reason = choice.finish_reason


def check_http(served: dict[int, HttpServed]) -> list[str]:
    """No 5xx anywhere; every request that stayed ends with stop/length and finite logprobs."""
    bad = []
    for s in served.values():
        if s.status is not None and s.status >= 500:
            bad.append(f"request {s.request.index} ({s.route}): HTTP {s.status}: {s.error}")
        elif s.aborted:
            continue
        elif s.error is not None or s.finish_reason not in ("stop", "length"):
            bad.append(f"request {s.request.index} ({s.route}): finish {s.finish_reason!r}, "
                       f"status {s.status}, error {s.error!r}")
        if not all(math.isfinite(x) for x in s.logprobs):
            bad.append(f"request {s.request.index}: non-finite logprob")
    return bad

"""A seeded random request schedule and a driver that serves it on an LLMEngine, step by step.

The schedule mixes what a serving engine meets in one afternoon: prompts of 1..300 tokens cut from
held-out text, budgets 1..E and "dense" in the same batches, greedy and sampled requests (temperature,
top-p, top-k, seeds), stop strings, max_tokens from 1 up, requests arriving while others decode, and
requests aborted part-way (a client that went away). About a third of the requests also carry the
OpenAI / vLLM controls (`extra` of each request, drawn from a second generator so the fields above
stay what they were): n and best_of, logit_bias, presence / frequency / repetition penalties,
min_p, min_tokens, stop_token_ids, and response_format (bounded JSON schemas, json_object). The same
schedule drives the HTTP test (by arrival time instead of engine steps), so both paths see the
same traffic.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

HELDOUT = Path(__file__).resolve().parent.parent / "data" / "heldout.txt"
STOPS = ("\n", " the", "(", ":", "\n\n", ".")
SCHEMAS = (
    {"type": "object", "additionalProperties": False,
     "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                    "kind": {"enum": ["a", "b", "c"]}, "ok": {"type": "boolean"}},
     "required": ["id", "kind", "ok"]},
    {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9}, "maxItems": 4},
    {"type": "object", "properties": {"tag": {"type": "string", "maxLength": 6},
                                      "xs": {"type": "array", "maxItems": 2,
                                             "items": {"enum": [1, 2, 3]}}},
     "required": ["tag", "xs"]},
)


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
    extra: dict = field(default_factory=dict)  # further SamplingParams fields (see random_extra)

    @property
    def n(self) -> int:
        return self.extra.get("n", 1)

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
    extra_rng = random.Random(f"extra-{seed}")
    out = []
    for i in range(num_requests):
        n = rng.choice([1, 2, 3, rng.randint(1, 40), rng.randint(1, max_prompt)])
        start = rng.randrange(0, len(pool) - n)
        greedy = rng.random() < 0.35
        extra = random_extra(extra_rng)
        out.append(ScheduledRequest(
            index=i, prompt_ids=pool[start:start + n],
            budget=random_budget(rng, num_experts, top_k),
            temperature=0.0 if greedy else rng.choice([0.3, 0.7, 1.0, 1.5, 2.0]),
            top_p=rng.choice([1.0, 1.0, 0.9, 0.5, 0.05]),
            top_k=rng.choice([-1, -1, 1, 5, 50]),
            max_tokens=_unless_schema(extra, rng.choice([1, 2, rng.randint(1, max_tokens),
                                                         max_tokens]), 64),
            stop=_unless_schema(extra, tuple(rng.sample(STOPS, rng.choice([0, 0, 1, 2]))), ()),
            seed=rng.choice([None, rng.randrange(2**31)]),
            logprobs=rng.choice([None, None, 0, 1, 5]),
            arrival=rng.randrange(arrival_span),
            abort_after=rng.randint(1, 4) if rng.random() < abort_share else None,
            stream=rng.random() < 0.5, extra=extra))
    return out


def _unless_schema(extra: dict, value, schema_value):
    """value, or schema_value for a response_format request (value is drawn either way, so the
    main generator's sequence does not depend on the extras)."""
    return schema_value if "schema" in extra else value


def random_extra(rng: random.Random, share: float = 0.35) -> dict:
    """SamplingParams fields beyond the basic ones for about `share` of the requests; each field
    appears on its own. Token ids are below 256 (valid in every test vocabulary). The schema is
    given as its index into SCHEMAS ("schema"), resolved by sampling_params; such a request gets
    64 tokens and no stop strings (a stop string would cut its JSON)."""
    if rng.random() >= share:
        return {}
    extra: dict = {}
    if rng.random() < 0.3:
        extra["n"] = rng.choice([2, 3])
        if rng.random() < 0.4:
            extra["best_of"] = extra["n"] + rng.randint(0, 2)
    if rng.random() < 0.3:
        extra["logit_bias"] = {rng.randrange(256): rng.choice([-100, -5, 3, 100])
                               for _ in range(rng.randint(1, 4))}
    for name, values in (("presence_penalty", [-1.0, 0.5, 2.0]),
                         ("frequency_penalty", [-0.5, 1.0, 2.0]),
                         ("repetition_penalty", [0.8, 1.3, 2.0]), ("min_p", [0.05, 0.3, 1.0])):
        if rng.random() < 0.2:
            extra[name] = rng.choice(values)
    if rng.random() < 0.25:
        extra["min_tokens"] = rng.randint(1, 6)
    if rng.random() < 0.25:
        extra["stop_token_ids"] = tuple(rng.sample(range(256), rng.randint(1, 3)))
    if rng.random() < 0.3:  # a stop token id would cut the JSON: not combined
        extra.pop("stop_token_ids", None)
        extra["schema"] = rng.choice([None, *range(len(SCHEMAS))])  # None: json_object
    return extra


@dataclass
class Choice:
    """What one choice of a scheduled request got back."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    num_outputs: int = 0
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class Served:
    """What one scheduled request got back from the engine, per choice index."""

    request: ScheduledRequest
    choices: dict[int, Choice] = field(default_factory=dict)
    num_outputs: int = 0

    @property
    def finish_reason(self) -> str | None:  # of the request: its first choice's
        return self.choices[0].finish_reason if 0 in self.choices else None

    @property
    def token_ids(self) -> list[int]:
        return self.choices[0].token_ids if 0 in self.choices else []


def sampling_params(req: ScheduledRequest, max_tokens: int | None = None):
    """The request's SamplingParams (max_tokens: override, e.g. for grammar requests)."""
    from base_sglang.protocol import ResponseFormat, SamplingParams

    extra = dict(req.extra)
    if "schema" in extra:
        index = extra.pop("schema")
        extra["response_format"] = (ResponseFormat.create("json_object") if index is None else
                                    ResponseFormat.create("json_schema", SCHEMAS[index]))
    max_tokens = req.max_tokens if max_tokens is None else max_tokens
    extra["min_tokens"] = min(extra.get("min_tokens", 0), max_tokens)
    return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                          max_tokens=max_tokens, stop=req.stop, seed=req.seed,
                          logprobs=req.logprobs, **extra)


def serve_on_engine(engine, schedule: list[ScheduledRequest], max_steps: int = 100_000):
    """Add each request at its arrival step, abort the leavers, step until everything finished.

    Returns {index: Served}. Raises AssertionError if a step raises, a choice gets output after
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
            c = s.choices.setdefault(out.index, Choice())
            assert c.finish_reason is None, f"output after finish for request {s.request.index}"
            s.num_outputs += 1
            c.num_outputs += 1
            c.token_ids += out.token_ids
            c.text += out.text
            c.logprobs += [lp.logprob for lp in out.logprobs or []]
            if out.finished:
                c.finish_reason, c.error = out.finish_reason, out.error
            elif s.request.abort_after is not None and s.num_outputs >= s.request.abort_after:
                for final in engine.abort(out.request_id):
                    f = s.choices.setdefault(final.index, Choice())
                    f.finish_reason, f.error = final.finish_reason, final.error
        if step >= last_arrival and not engine.has_unfinished():
            break
    assert not engine.has_unfinished(), "the schedule did not drain"
    return served


def check_served(served: dict[int, Served], eos_ids=frozenset()) -> list[str]:
    """Everything a healthy engine guarantees for every choice of every request; returns the
    violations. eos_ids: the engine's EOS tokens (for the min_tokens check)."""
    bad = []
    for s in served.values():
        req = s.request
        if sorted(s.choices) != list(range(req.n)):
            bad.append(f"request {req.index}: choices {sorted(s.choices)} of n={req.n}")
        for i, c in s.choices.items():
            bad += [f"request {req.index} choice {i}: {m}" for m in _check_choice(req, c, eos_ids)]
        if req.extra.get("best_of", req.n) > req.n and s.finish_reason in ("stop", "length") \
                and any(c.num_outputs != 1 for c in s.choices.values()):
            bad.append(f"request {req.index}: best_of streamed before the end")
    return bad


def _check_choice(req: ScheduledRequest, c: Choice, eos_ids) -> list[str]:
    bad = []
    want = {"stop", "length"} | ({"abort"} if req.abort_after is not None else set())
    if c.error is not None or c.finish_reason not in want:
        bad.append(f"finish {c.finish_reason!r}, error {c.error!r}")
    if not all(math.isfinite(x) for x in c.logprobs):
        bad.append("non-finite logprob")
    if c.finish_reason == "length" and len(c.token_ids) != req.max_tokens:
        bad.append(f"length finish after {len(c.token_ids)} of {req.max_tokens} tokens")
    if req.logprobs is not None and c.finish_reason in ("stop", "length") \
            and len(c.logprobs) != len(c.token_ids):
        bad.append(f"{len(c.logprobs)} logprobs for {len(c.token_ids)} tokens")
    if c.finish_reason not in ("stop", "length"):
        return bad
    extra, body = req.extra, c.token_ids[:-1]  # every token but a final stop token
    ends = set(extra.get("stop_token_ids", ())) | set(eos_ids)
    if "schema" not in extra:
        if len(body) + 1 < extra.get("min_tokens", 0) and c.token_ids and c.token_ids[-1] in ends:
            bad.append(f"stopped after {len(c.token_ids)} tokens, min_tokens "
                       f"{extra['min_tokens']}")
        banned = {t for t, b in extra.get("logit_bias", {}).items() if b == -100}
        if banned & set(c.token_ids):
            bad.append(f"banned tokens {banned & set(c.token_ids)} were generated")
    if set(extra.get("stop_token_ids", ())) & set(body):
        bad.append("a stop_token_id did not end the output")
    if "schema" in extra and c.finish_reason == "stop":
        bad += _check_json(c.text, extra["schema"])
    return bad


def _check_json(text: str, schema_index: int | None) -> list[str]:
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        return [f"response_format output is not JSON ({exc}): {text[:80]!r}"]
    if schema_index is None:
        return [] if isinstance(value, dict) else [f"json_object output is not an object: {text!r}"]
    import jsonschema

    try:
        jsonschema.validate(value, SCHEMAS[schema_index])
    except jsonschema.ValidationError as exc:
        return [f"output does not match schema {schema_index}: {exc.message}"]
    return []


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

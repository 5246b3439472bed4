"""A bounded load and fault run on loopback: concurrent streams with mixed budgets, client aborts,
queue overflow. No request is lost or stuck, and /metrics adds up:
requests in = finished + aborted + rejected."""

import asyncio
import random
import time

import httpx
import openai
import pytest

MODEL = "tiny"  # served_model_name in conftest.py


@pytest.fixture
def small_queue(server, monkeypatch):
    """4 running + 4 waiting: a burst of 40 overflows the queue."""
    monkeypatch.setattr(server.engine.scheduler, "max_running", 4)
    monkeypatch.setattr(server.engine.scheduler, "max_waiting", 4)
    return server


def _samples(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines()
                                     if ln and not ln.startswith("#"))}


def _gen_total(samples, endpoint_statuses=None) -> float:
    total = 0.0
    for key, v in samples.items():
        if not key.startswith("base_requests_total{"):
            continue
        if 'endpoint="completions"' not in key and 'endpoint="chat"' not in key:
            continue
        status = key.split('status="')[1].split('"')[0]
        if endpoint_statuses is None or status in endpoint_statuses:
            total += v
    return total


def test_burst_with_aborts_and_overflow_loses_nothing(small_queue):
    server = small_queue
    before = _samples(httpx.get(f"{server.url}/metrics").text)
    rng = random.Random(7)
    outcomes = []

    async def one(client, i):
        stream = rng.random() < 0.6
        leave = rng.random() < 0.25  # the client goes away part-way
        budget = rng.choice([1, 2, 3, 8, "dense"])
        kw = dict(model=MODEL, prompt=f"Request {i}:", max_tokens=rng.choice([4, 16, 48]),
                  temperature=rng.choice([0.0, 1.0]), extra_body={"expert_budget": budget,
                                                                  "ignore_eos": True})
        await asyncio.sleep(rng.random() * 0.05)
        try:
            if stream:
                resp = await client.completions.create(stream=True, **kw)
                n, finish = 0, None
                async for chunk in resp:
                    n += 1
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
                    if leave and n >= 2:
                        await resp.close()
                        return "left"
                return finish or "no finish"
            if leave:
                await client.completions.create(timeout=0.02, **kw)
                return "finished before leaving"
            return (await client.completions.create(**kw)).choices[0].finish_reason
        except openai.APIStatusError as exc:
            assert exc.status_code == 503, exc
            assert exc.response.headers.get("retry-after") == "1"
            return "503"
        except (openai.APITimeoutError, openai.APIConnectionError):
            return "left" if leave else "lost"

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x",
                                      max_retries=0, timeout=60) as client:
            return await asyncio.gather(*(one(client, i) for i in range(40)))

    t0 = time.monotonic()
    outcomes = asyncio.run(run())
    assert time.monotonic() - t0 < 60
    allowed = {"length", "stop", "left", "503", "finished before leaving"}
    assert set(outcomes) <= allowed, outcomes
    assert outcomes.count("503") >= 1 and outcomes.count("length") >= 4
    deadline = time.monotonic() + 10
    while server.backend.stats()["num_requests_running"] or server.backend.async_engine.num_live:
        assert time.monotonic() < deadline, "a request is stuck"
        time.sleep(0.05)
    time.sleep(0.3)  # the last streams' accounting runs when their generators close
    after = _samples(httpx.get(f"{server.url}/metrics").text)

    def delta(name):
        return after.get(name, 0.0) - before.get(name, 0.0)

    requests_in = _gen_total(after) - _gen_total(before)
    rejected = (_gen_total(after, {"400", "401", "404", "413", "503"})
                - _gen_total(before, {"400", "401", "404", "413", "503"}))
    finished = sum(delta(f'base_request_finish_total{{reason="{r}"}}')
                   for r in ("stop", "length", "abort", "error"))
    assert requests_in == 40
    assert requests_in == finished + rejected, (requests_in, finished, rejected)
    assert delta('base_request_finish_total{reason="abort"}') >= 1  # client aborts are counted
    assert delta('base_request_finish_total{reason="error"}') == 0

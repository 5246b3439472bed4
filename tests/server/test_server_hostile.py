"""Hostile and careless clients: oversized bodies, prompts that cannot fit, impossible capacity,
overflowing and non-finite numbers, OpenAI fields the server does not implement, streaming usage."""

import json
import math
import threading
import time

import httpx
import pytest

MODEL = "tiny"  # served_model_name in conftest.py
OK = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 0}


def post(server, json_body=None, path="/v1/completions", **kw):
    return httpx.post(f"{server.url}{path}", json=json_body, timeout=60, **kw)


def assert_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    if param is not None:
        assert err["param"] == param and err["message"].startswith(f"{param}:"), err
    if code is not None:
        assert err["code"] == code, err
    return err


def test_a_10mb_prompt_is_refused_at_once_and_health_stays_fast(server):
    big = json.dumps({**OK, "prompt": "x" * (10 << 20)}).encode()
    health_ms = []
    stop = threading.Event()

    def probe():
        with httpx.Client(timeout=5) as c:
            c.get(f"{server.url}/health")  # connection set-up is the client's cost: not counted
            while not stop.is_set():
                t0 = time.perf_counter()
                assert c.get(f"{server.url}/health").status_code == 200
                health_ms.append((time.perf_counter() - t0) * 1000)
                time.sleep(0.002)

    t = threading.Thread(target=probe)
    t.start()
    took = []
    try:
        time.sleep(0.05)
        for _ in range(5):
            t0 = time.perf_counter()
            r = httpx.post(f"{server.url}/v1/completions", content=big, timeout=60,
                           headers={"Content-Type": "application/json"})
            took.append(time.perf_counter() - t0)
            assert_error(r, 413, code="request_too_large")
    finally:
        stop.set()
        t.join()
    assert max(took) < 1.0  # the body is never parsed (it was 8.7 s)
    health_ms.sort()
    # median and 90th percentile: one slow probe on a shared 2-core CI machine (514 ms once) is
    # not the event loop blocking on a body (that made every probe during a post slow)
    p90 = health_ms[int(0.9 * (len(health_ms) - 1))]
    assert len(health_ms) >= 5 and health_ms[len(health_ms) // 2] < 20 and p90 < 50


def test_a_body_without_content_length_is_cut_at_the_limit(server):
    def chunks():
        for _ in range(12):
            yield b" " * (1 << 20)  # 12 MiB of JSON whitespace, chunked

    r = httpx.post(f"{server.url}/v1/completions", content=chunks(), timeout=60,
                   headers={"Content-Type": "application/json"})
    assert_error(r, 413)


def test_a_large_unused_field_is_refused(server):
    r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                   content=json.dumps({**OK, "junk": "y" * (9 << 20)}).encode(),
                   headers={"Content-Type": "application/json"})
    assert_error(r, 413)


def test_a_prompt_too_long_for_any_tokenisation_is_400_before_tokenising(server):
    limits = server.app.state.limits
    text = "z" * (limits.max_prompt_chars + 1)
    t0 = time.perf_counter()
    err = assert_error(post(server, {**OK, "prompt": text}), 400, "prompt")
    assert "--max-model-len" in err["message"] and time.perf_counter() - t0 < 1.0
    chat = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    assert_error(post(server, chat, "/v1/chat/completions"), 400, "messages")


def test_more_prompts_than_the_server_can_ever_hold_is_400(server):
    cap = server.backend.capacity
    err = assert_error(post(server, {**OK, "prompt": ["a"] * (cap + 1)}), 400, "prompt",
                       "too_many_prompts")
    assert str(cap) in err["message"]


def test_queue_full_503_carries_retry_after(server, monkeypatch):
    from base_sglang.protocol import QueueFull

    def full(*a, **k):
        raise QueueFull("the waiting queue is full (0 requests)")

    monkeypatch.setattr(server.backend, "generate", full)
    r = post(server, OK)
    assert_error(r, 503, code="queue_full")
    assert r.headers["retry-after"] == "1"


@pytest.mark.parametrize("change,param", [
    ({"seed": 2**70}, "seed"), ({"seed": -(2**64)}, "seed"), ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"), ({"top_p": math.nan}, "top_p"),
    ({"max_tokens": 2**70}, "max_tokens"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"top_k": -5}, "top_k"), ({"prompt": [[]]}, "prompt"), ({"expert_budget": math.nan}, "expert_budget"),
])
def test_bad_numbers_name_their_field_without_internals(server, change, param):
    body = json.dumps({**OK, **change})  # Python writes NaN/Infinity tokens, as some clients do
    r = httpx.post(f"{server.url}/v1/completions", content=body, timeout=60,
                   headers={"Content-Type": "application/json"})
    err = assert_error(r, 400, param)
    for internal in ("Overflow", "Traceback", "long long", "Error:"):
        assert internal not in err["message"]


def test_a_huge_valid_seed_works(server):
    r = post(server, {**OK, "temperature": 1.0, "seed": 2**64 - 1})
    assert r.status_code == 200


@pytest.mark.parametrize("route,field,value", [
    ("completions", "suffix", "x"), ("chat", "functions", [{"name": "f"}]),
    ("chat", "function_call", "auto"), ("chat", "audio", {"voice": "alloy"}),
    ("chat", "modalities", ["text", "audio"]), ("chat", "prediction", {"type": "content"}),
])
def test_unimplemented_openai_fields_are_refused_by_name(server, route, field, value):
    body = dict(OK) if route == "completions" else {
        "model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    path = "/v1/completions" if route == "completions" else "/v1/chat/completions"
    assert_error(post(server, {**body, field: value}, path), 400, field)


def test_openai_defaults_of_unimplemented_fields_are_accepted(server):
    body = {**OK, "frequency_penalty": 0, "presence_penalty": 0, "best_of": 1, "logit_bias": None,
            "suffix": None}
    assert post(server, body).status_code == 200


def _stream(server, body, path="/v1/completions"):
    with httpx.stream("POST", f"{server.url}{path}", json={**body, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streaming_usage_only_when_asked_once_and_last(server, path):
    body = {**OK, "max_tokens": 4, "ignore_eos": True}
    if path.endswith("chat/completions"):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                "ignore_eos": True}
    plain = _stream(server, body, path)
    assert all(c.get("usage") is None for c in plain)
    asked = _stream(server, {**body, "stream_options": {"include_usage": True}}, path)
    with_usage = [c for c in asked if c.get("usage") is not None]
    assert len(with_usage) == 1 and with_usage[0] is asked[-1] and asked[-1]["choices"] == []
    assert asked[-1]["usage"]["completion_tokens"] == 4

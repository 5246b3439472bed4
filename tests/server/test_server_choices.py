"""n choices and best_of through the official openai client (completions and chat, streaming and
not): choices indexed as OpenAI does, usage summed, per-choice logprobs, best_of ranking."""

import httpx
import pytest
from openai import BadRequestError, OpenAI

MODEL = "tiny"  # served_model_name in conftest.py
PROMPT = "The quick brown fox"
SAMPLED = dict(max_tokens=6, temperature=1.0, seed=11, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_n_completions_are_indexed_and_reproducible(client):
    resp = client.completions.create(model=MODEL, prompt=PROMPT, n=3, **SAMPLED)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    texts = [c.text for c in resp.choices]
    assert len(set(texts)) > 1  # the choices sample independently
    assert all(c.finish_reason == "length" for c in resp.choices)
    one = client.completions.create(model=MODEL, prompt=PROMPT, n=1, **SAMPLED)
    assert one.choices[0].text == texts[0]  # choice 0 draws from the seed itself
    assert resp.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counts once
    assert resp.usage.completion_tokens == 3 * 6
    again = client.completions.create(model=MODEL, prompt=PROMPT, n=3, **SAMPLED)
    assert [c.text for c in again.choices] == texts


def test_n_with_several_prompts_numbers_choices_prompt_major(client):
    prompts = [PROMPT, "def add(a, b):"]
    resp = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=5,
                                     temperature=0, extra_body={"ignore_eos": True})
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    for p, prompt in enumerate(prompts):
        solo = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text
        assert [resp.choices[2 * p + j].text for j in range(2)] == [solo, solo]  # greedy
    assert resp.usage.completion_tokens == 4 * 5


def test_n_streaming_completions_carry_the_choice_index(client):
    full = client.completions.create(model=MODEL, prompt=[PROMPT, "Hello"], n=2, **SAMPLED)
    streamed, finished = {}, set()
    stream = client.completions.create(model=MODEL, prompt=[PROMPT, "Hello"], n=2, stream=True,
                                       stream_options={"include_usage": True}, **SAMPLED)
    chunks = list(stream)
    for chunk in chunks[:-1]:
        [c] = chunk.choices
        streamed[c.index] = streamed.get(c.index, "") + c.text
        if c.finish_reason:
            finished.add(c.index)
    assert streamed == {c.index: c.text for c in full.choices} and finished == {0, 1, 2, 3}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4 * 6
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_n_chat_streaming_and_not_agree(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=3, max_tokens=5,
              temperature=0.9, seed=3, extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw)
    assert [c.index for c in full.choices] == [0, 1, 2]
    assert full.usage.completion_tokens == 15
    chunks = list(client.chat.completions.create(**kw, stream=True))
    roles = [c.choices[0].index for c in chunks if c.choices[0].delta.role == "assistant"]
    assert sorted(roles) == [0, 1, 2]  # every choice opens with its role
    text = {i: "" for i in range(3)}
    for c in chunks:
        text[c.choices[0].index] += c.choices[0].delta.content or ""
    assert text == {c.index: c.message.content for c in full.choices}


def test_per_choice_logprobs(client):
    resp = client.completions.create(model=MODEL, prompt=PROMPT, n=2, logprobs=2, **SAMPLED)
    for c in resp.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == 6
        assert "".join(lp.tokens) == c.text
        # top_logprobs maps decoded text -> logprob: 2 alternatives (+ the sampled token), fewer
        # where two ids decode to the same text
        assert all(1 <= len(top) <= 3 and tok in top for tok, top in zip(lp.tokens,
                                                                       lp.top_logprobs))
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2, logprobs=True,
        top_logprobs=3, max_tokens=4, temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    for c in chat.choices:
        assert len(c.logprobs.content) == 4
        assert all(len(t.top_logprobs) == 3 for t in c.logprobs.content)
    assert [t.token for t in chat.choices[0].logprobs.content] != \
        [t.token for t in chat.choices[1].logprobs.content]


def test_best_of_returns_the_most_likely_choices(client):
    """best_of=4, n=2 returns the two of the n=4 choices (same seed) with the highest sum of
    token logprobs, best first."""
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=1.2, seed=5, logprobs=0,
              extra_body={"ignore_eos": True})
    four = client.completions.create(n=4, **kw).choices
    sums = [sum(c.logprobs.token_logprobs) for c in four]
    best = client.completions.create(n=2, best_of=4, **kw)
    order = sorted(range(4), key=lambda i: -sums[i])[:2]
    assert [c.text for c in best.choices] == [four[i].text for i in order]
    assert [c.index for c in best.choices] == [0, 1]
    assert best.usage.completion_tokens == 2 * 5  # the returned choices' tokens


def test_best_of_limits(client, server):
    with pytest.raises(BadRequestError, match="best_of: must be >= n"):
        client.completions.create(model=MODEL, prompt=PROMPT, n=3, best_of=2, max_tokens=2)
    with pytest.raises(BadRequestError, match="best_of: streaming is not supported"):
        client.completions.create(model=MODEL, prompt=PROMPT, n=1, best_of=2, max_tokens=2,
                                  stream=True)
    ok = client.completions.create(model=MODEL, prompt=PROMPT, n=2, best_of=2, max_tokens=2,
                                   stream=True)  # best_of == n streams
    assert {c.choices[0].index for c in ok if c.choices} == {0, 1}
    r = httpx.post(f"{server.url}/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": PROMPT, "best_of": 17, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # needs logprobs: true
    ("/v1/completions", {"logprobs": 6}, "logprobs"),
    ("/v1/completions", {"n": 0}, "n"), ("/v1/chat/completions", {"n": 129}, "n"),
])
def test_logprob_and_choice_limits_as_openai(server, path, body, param):
    base = {"model": MODEL, "max_tokens": 2}
    base.update({"prompt": "x"} if path == "/v1/completions" else
                {"messages": [{"role": "user", "content": "x"}]})
    r = httpx.post(f"{server.url}{path}", json={**base, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_leaving_a_multi_choice_stream_frees_every_row(server):
    import time

    body = {"model": MODEL, "prompt": PROMPT, "n": 3, "max_tokens": 1000, "temperature": 1.0,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(8)]
        assert sum(ln.startswith("data: ") for ln in got) >= 3
        assert server.engine.runner.kv.num_rows == 3
    deadline = time.monotonic() + 10
    while server.engine.runner.kv.num_rows or server.backend.async_engine.num_live:
        assert time.monotonic() < deadline, "the choices still hold their rows"
        time.sleep(0.05)

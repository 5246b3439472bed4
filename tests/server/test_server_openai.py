"""The official openai client against the live server: completions, chat, streaming, budgets."""

import asyncio

import httpx
import pytest
import torch
from openai import AsyncOpenAI, AuthenticationError, OpenAI
from transformers import AutoModelForCausalLM

MODEL = "tiny"  # served_model_name in conftest.py

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_models(client):
    [card] = client.models.list().data
    assert card.id == MODEL and card.model_extra["num_experts"] == 8


def test_dense_greedy_completion_equals_transformers(client, server):
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True})
    tok = server.engine.tokenizer
    model = AutoModelForCausalLM.from_pretrained(server.model_dir).eval()
    ids = tok(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert resp.choices[0].text == tok.decode(ref[0, ids.shape[1]:], skip_special_tokens=True)
    assert resp.usage.completion_tokens == 8 and resp.usage.prompt_tokens == ids.shape[1]
    assert resp.usage.model_extra["expert_budget"] == "dense"  # the server default


def test_budget_via_header_and_body(client):
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
        extra_headers={"X-Expert-Budget": "3"})
    usage = raw.parse().usage.model_extra
    assert raw.headers["x-expert-budget"] == "3" and usage["expert_budget"] == 3
    assert usage["experts_per_layer"] <= 3 and usage["experts_per_layer_dense"] >= 1
    raw = client.completions.with_raw_response.create(  # body wins over the header
        model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
        extra_headers={"X-Expert-Budget": "3"}, extra_body={"expert_budget": 1})
    usage = raw.parse().usage.model_extra
    assert raw.headers["x-expert-budget"] == "1" and usage["expert_budget"] == 1
    assert usage["experts_per_layer"] == 1.0  # alone in its batch: M = 1 in every step
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        extra_body={"expert_budget": "dense"})
    assert raw.headers["x-expert-budget"] == "dense"
    assert raw.parse().usage.model_extra["expert_budget"] == "dense"


def test_chat_and_streaming_agree(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    kw = dict(model=MODEL, messages=messages, max_tokens=10, temperature=0,
              extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw)
    assert full.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(**kw, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_completion_streaming_ends_with_done(client, server):
    kw = dict(model=MODEL, prompt=[PROMPT], max_tokens=6, temperature=0,
              extra_body={"ignore_eos": True})
    full = client.completions.create(**kw).choices[0].text
    parts = list(client.completions.create(**kw, stream=True))
    assert "".join(p.choices[0].text for p in parts) == full
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                      json={**{k: v for k, v in kw.items() if k != "extra_body"}, "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)


def test_logprobs_with_echo_score_the_prompt(client, server):
    """lm-eval local-completions loglikelihood: echo + logprobs, token-id prompts, max_tokens 0/1."""
    tok = server.engine.tokenizer
    ids = tok.encode("Hello, world! How are you today?")
    model = AutoModelForCausalLM.from_pretrained(server.model_dir).eval()
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)  # [L, V]
    resp = client.completions.create(model=MODEL, prompt=[ids, ids[:3]], max_tokens=1,
                                     temperature=0, logprobs=1, echo=True)
    lp = resp.choices[0].logprobs
    assert len(lp.token_logprobs) == len(ids) + 1 and lp.token_logprobs[0] is None
    for t in range(1, len(ids)):
        assert lp.token_logprobs[t] == pytest.approx(ref[t - 1, ids[t]].item(), abs=1e-4)
        assert max(lp.top_logprobs[t].values()) == pytest.approx(ref[t - 1].max().item(), abs=1e-4)
    assert lp.token_logprobs[-1] == pytest.approx(ref[-1].max().item(), abs=1e-4)  # greedy token
    assert resp.choices[0].text.startswith(tok.decode(ids))
    assert len(resp.choices[1].logprobs.token_logprobs) == 4
    zero = client.completions.create(model=MODEL, prompt="Hello, world!", max_tokens=0,
                                     logprobs=0, echo=True)
    assert zero.choices[0].text == "Hello, world!" and zero.usage.completion_tokens == 0
    assert len(zero.choices[0].logprobs.token_logprobs) == len(tok.encode("Hello, world!"))


def test_concurrent_streams_share_decode_steps(server):
    """12 streaming requests at once, mixed budgets: batched, all complete, budget rule holds."""
    budgets = [1, 2, 3, "dense"] * 3
    E = server.engine.num_experts
    start = len(server.engine.stats.recent)

    def length(budget):  # dense requests leave early: later steps run reduced
        return 4 if budget == "dense" else 12

    async def one(client, i, budget):
        stream = await client.completions.create(
            model=MODEL, prompt=f"Numbers: {i} {i + 1}", max_tokens=length(budget), temperature=0,
            stream=True, stream_options={"include_usage": True},
            extra_body={"expert_budget": budget, "ignore_eos": True})
        chunks = [chunk async for chunk in stream]
        *body, last = chunks
        assert last.choices == [] and all(c.usage is None for c in body)  # usage once, last
        return body[-1], last.usage

    async def run_all():
        async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as c:
            return await asyncio.gather(*(one(c, i, b) for i, b in enumerate(budgets)))

    lasts = asyncio.run(run_all())
    assert [x.choices[0].finish_reason for x, _ in lasts] == ["length"] * 12
    for (_, use), budget in zip(lasts, budgets):
        assert use.completion_tokens == length(budget) and use.model_extra["expert_budget"] == budget
    steps = [s for s in list(server.engine.stats.recent)[start:] if not s.is_prefill]
    assert max(s.batch_size for s in steps) > 1
    for s in steps:
        assert s.batch_budget == max(s.budgets)
        assert all(n <= s.batch_budget for n in s.experts_executed)
        if E in s.budgets:
            assert s.experts_executed == s.experts_routed
    assert any(s.batch_budget < E and s.experts_routed != s.experts_executed for s in steps)


def test_api_key(server, settings_override):
    settings_override(api_key="sekret")
    bad = OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(AuthenticationError):
        bad.models.list()
    r = httpx.get(f"{server.url}/v1/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    good = OpenAI(base_url=f"{server.url}/v1", api_key="sekret", max_retries=0)
    assert good.completions.create(model=MODEL, prompt="hi", max_tokens=1).choices
    assert httpx.get(f"{server.url}/health").status_code == 200  # probes need no key


def test_chat_logprobs(client):
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0,
        logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens == 5
    for tok in content:
        assert len(tok.top_logprobs) == 3 and tok.logprob <= 0
        assert tok.logprob == pytest.approx(max(t.logprob for t in tok.top_logprobs))  # greedy


def test_multi_prompt_streaming_and_stop_and_seed(client):
    kw = dict(model=MODEL, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    prompts = ["Hello, world!", "Numbers: 1 2 3"]
    full = client.completions.create(prompt=prompts, **kw)
    texts = {c.index: c.text for c in full.choices}
    streamed = {0: "", 1: ""}
    finished = set()
    for chunk in client.completions.create(prompt=prompts, stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] += c.text
            if c.finish_reason:
                finished.add(c.index)
    assert streamed == texts and finished == {0, 1}
    stop = texts[0][2:4]
    cut = client.completions.create(prompt=prompts[0], stop=[stop], **kw).choices[0]
    assert cut.text == texts[0][:texts[0].find(stop)] and cut.finish_reason == "stop"
    sampled = [client.completions.create(model=MODEL, prompt=prompts[0], max_tokens=8,
                                         temperature=1.0, seed=s).choices[0].text
               for s in (7, 7, 8)]
    assert sampled[0] == sampled[1] != sampled[2]

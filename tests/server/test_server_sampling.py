"""The sampling controls through the official openai client: logit_bias (string keys),
presence/frequency/repetition penalties, min_p, min_tokens, stop_token_ids, against a greedy loop
over the transformers model that applies each control by its definition (the server serves dense
by default, where the engine equals transformers)."""

import httpx
import pytest
import torch
from openai import BadRequestError, OpenAI
from transformers import AutoModelForCausalLM

MODEL = "tiny"  # served_model_name in conftest.py
PROMPT = "def add(a, b):"  # greedy: ' today', 'k', ' o', ... (tokens that decode cleanly)
REPEATS = "Numbers: 1 2 3"  # greedy output repeats one token (the penalties change it)
N = 8


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(server):
    model = AutoModelForCausalLM.from_pretrained(server.model_dir).eval()
    tok = server.engine.tokenizer

    def greedy(prompt, steps=N, bias=None, presence=0.0, frequency=0.0, repetition=1.0):
        ids = tok.encode(prompt)
        prompt_ids, out = list(ids), []
        for _ in range(steps):
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0, -1].float()  # [V]
            for t, b in (bias or {}).items():
                logits[t] += b
            for t in set(prompt_ids + out):  # repetition: prompt and output (vLLM)
                logits[t] = logits[t] / repetition if logits[t] > 0 else logits[t] * repetition
            for t in set(out):  # OpenAI's penalties: the output only
                logits[t] -= frequency * out.count(t) + presence
            nxt = int(logits.argmax())
            out.append(nxt)
            ids.append(nxt)
        return out

    return greedy


def ids_of(server, text):
    return server.engine.tokenizer.encode(text, add_special_tokens=False)


def completion(client, **kw):
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0)
    extra = {"ignore_eos": True, **kw.pop("extra_body", {})}
    return client.completions.create(**{**args, **kw}, extra_body=extra).choices[0]


def test_penalties_equal_their_definitions(client, server, reference):
    cases = [dict(presence_penalty=1.5), dict(frequency_penalty=2.0),
             dict(presence_penalty=-0.5, frequency_penalty=0.7,
                  extra_body={"repetition_penalty": 1.6})]
    plain = completion(client, prompt=REPEATS).text
    texts = []
    for kw in cases:
        rep = kw.get("extra_body", {}).get("repetition_penalty", 1.0)
        want = reference(REPEATS, presence=kw.get("presence_penalty", 0.0),
                         frequency=kw.get("frequency_penalty", 0.0), repetition=rep)
        got = completion(client, prompt=REPEATS, **kw).text
        assert got == server.engine.tokenizer.decode(want, skip_special_tokens=True), kw
        texts.append(got)
    assert any(t != plain for t in texts)  # the penalties changed the output


def test_logit_bias_with_string_keys(client, server, reference):
    target = ids_of(server, " fox")[-1]
    forced = completion(client, logit_bias={str(target): 100})
    assert server.engine.tokenizer.encode(forced.text, add_special_tokens=False) == [target] * N \
        or forced.text == server.engine.tokenizer.decode([target] * N)
    first = reference(PROMPT, steps=1)[0]
    banned = completion(client, max_tokens=4, logit_bias={str(first): -100})
    want = reference(PROMPT, steps=4, bias={first: -100})
    assert banned.text == server.engine.tokenizer.decode(want, skip_special_tokens=True)
    assert first not in want


def test_min_p_one_is_greedy(client):
    greedy = completion(client).text
    sampled = completion(client, temperature=1.0, seed=1, extra_body={"min_p": 1.0})
    assert sampled.text == greedy  # only the top token survives min_p = 1


def test_stop_token_ids_end_the_output(client, server, reference):
    want = reference(PROMPT)
    stop = want[3]
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0,
                                     extra_body={"ignore_eos": True, "stop_token_ids": [stop]})
    cut = want.index(stop)
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens == cut + 1  # the stop token is part of the output
    assert resp.choices[0].text == server.engine.tokenizer.decode(want[:cut + 1],
                                                                  skip_special_tokens=True)


def test_min_tokens_masks_stop_token_ids(client, reference):
    want = reference(PROMPT)
    stop = want[0]  # would stop at once
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0,
                                     extra_body={"ignore_eos": True, "stop_token_ids": [stop],
                                                 "min_tokens": 4})
    assert resp.usage.completion_tokens >= 4


@pytest.mark.parametrize("body,param", [
    ({"logit_bias": {"abc": 1}}, "logit_bias"), ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"999999": 1}}, "logit_bias"),  # beyond the vocabulary
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_p": 1.5}, "min_p"),
    ({"min_tokens": 20, "max_tokens": 4}, "min_tokens"), ({"stop_token_ids": [-1]}, "stop_token_ids.0"),
    ({"stop_token_ids": [10**7]}, "stop_token_ids"), ({"top_k": 2**64}, "top_k"),
])
def test_bad_controls_name_their_field(server, body, param):
    for path, base in (("/v1/completions", {"prompt": "x"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
        r = httpx.post(f"{server.url}{path}", json={"model": MODEL, "max_tokens": 4, **base,
                                                     **body}, timeout=30)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["message"].startswith(param), err


def test_openai_client_errors_name_the_field(client):
    with pytest.raises(BadRequestError, match="presence_penalty"):
        client.completions.create(model=MODEL, prompt=PROMPT, presence_penalty=3)

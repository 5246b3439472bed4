"""The vLLM / SGLang native routes: GET /v1/models/{id} (max_model_len), /tokenize and /detokenize
in vLLM's shape (and SGLang's list forms), SGLang's /generate (plain, batch, n, streaming with
cumulative text, budgets through custom_params)."""

import json

import httpx
import pytest
from openai import NotFoundError, OpenAI

MODEL = "tiny"  # served_model_name in conftest.py
PROMPT = "The quick brown fox"


def post(server, path, body, **kw):
    return httpx.post(f"{server.url}{path}", json=body, timeout=60, **kw)


def test_model_card_by_id(server):
    c = OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    card = c.models.retrieve(MODEL)
    assert card.id == MODEL and card.model_extra["max_model_len"] == server.engine.max_model_len
    assert card.model_extra["num_experts"] == 8
    with pytest.raises(NotFoundError):
        c.models.retrieve("gpt-17")


def test_tokenize_and_detokenize_as_vllm(server):
    tok = server.engine.tokenizer
    r = post(server, "/tokenize", {"model": MODEL, "prompt": PROMPT})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body == {"count": len(tok.encode(PROMPT)), "max_model_len": server.engine.max_model_len,
                    "tokens": tok.encode(PROMPT), "token_strs": None}
    back = post(server, "/detokenize", {"model": MODEL, "tokens": body["tokens"]}).json()
    assert back == {"prompt": PROMPT, "text": PROMPT}
    strs = post(server, "/v1/tokenize", {"prompt": PROMPT, "return_token_strs": True,
                                         "add_special_tokens": False}).json()
    assert strs["token_strs"] == tok.convert_ids_to_tokens(strs["tokens"])
    many = post(server, "/tokenize", {"prompt": [PROMPT, "Hello"]}).json()  # SGLang's list form
    assert many["count"] == [len(tok.encode(PROMPT)), len(tok.encode("Hello"))]
    texts = post(server, "/v1/detokenize", {"tokens": many["tokens"]}).json()
    assert texts["text"] == [PROMPT, "Hello"]


def test_tokenize_messages_equals_the_chat_prompt(server):
    messages = [{"role": "user", "content": "Hi there"}]
    count = post(server, "/tokenize", {"model": MODEL, "messages": messages}).json()["count"]
    chat = OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=1)
    assert chat.usage.prompt_tokens == count
    bare = post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False})
    assert bare.json()["count"] < count


@pytest.mark.parametrize("path,body,param", [
    ("/tokenize", {"model": MODEL}, "prompt"),  # neither prompt nor messages
    ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "prompt"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/detokenize", {"tokens": [10**6]}, "tokens"), ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
])
def test_tokenize_errors_name_the_field(server, path, body, param):
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert post(server, path, {**body, "model": "other"}).status_code in (400, 404)


def test_generate_matches_completions(server):
    sp = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = post(server, "/generate", {"text": PROMPT, "sampling_params": sp})
    assert r.status_code == 200, r.text
    out = r.json()
    ref = post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 6,
                                           "temperature": 0, "ignore_eos": True}).json()
    assert out["text"] == ref["choices"][0]["text"] and len(out["output_ids"]) == 6
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == ref["usage"]["prompt_tokens"] and meta["completion_tokens"] == 6
    ids = post(server, "/generate", {"input_ids": server.engine.tokenizer.encode(PROMPT),
                                     "sampling_params": sp}).json()
    assert ids["output_ids"] == out["output_ids"]


def test_generate_batch_n_logprobs_and_budget(server):
    sp = {"max_new_tokens": 4, "temperature": 0.8, "sampling_seed": 3, "n": 2,
          "custom_params": {"expert_budget": 2}}
    r = post(server, "/generate", {"text": [PROMPT, "Hello"], "sampling_params": sp,
                                   "return_logprob": True, "top_logprobs_num": 2})
    outs = r.json()
    assert r.status_code == 200 and len(outs) == 4 and r.headers["x-expert-budget"] == "2"
    for o in outs:
        meta = o["meta_info"]
        assert meta["expert_budget"] == 2 and meta["experts_per_layer"] <= 2
        assert [t for _, t, _ in meta["output_token_logprobs"]] == o["output_ids"]
        assert all(len(top) == 2 for top in meta["output_top_logprobs"])
    dense = {**sp, "custom_params": {"expert_budget": "dense"}}  # batch-independent outputs
    pair = post(server, "/generate", {"text": PROMPT, "sampling_params": dense}).json()
    one = post(server, "/generate", {"text": PROMPT, "sampling_params": {**dense, "n": 1}}).json()
    assert isinstance(one, dict) and len(pair) == 2
    assert one["output_ids"] == pair[0]["output_ids"]  # choice 0 draws from the seed itself
    header = post(server, "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 2}},
                  headers={"X-Expert-Budget": "3"})
    assert header.json()["meta_info"]["expert_budget"] == 3


def test_generate_streams_cumulative_outputs(server):
    sp = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    full = post(server, "/generate", {"text": PROMPT, "sampling_params": sp}).json()
    with httpx.stream("POST", f"{server.url}/generate", timeout=60,
                      json={"text": PROMPT, "sampling_params": sp, "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(ln[6:]) for ln in lines[:-1]]
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == 6  # cumulative, as SGLang streams
    assert events[-1]["text"] == full["text"] and events[-1]["output_ids"] == full["output_ids"]
    assert all(full["text"].startswith(e["text"]) for e in events)
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"


@pytest.mark.parametrize("body,param", [
    ({"sampling_params": {"max_new_tokens": 2}}, "text"),  # no prompt
    ({"text": "x", "input_ids": [1]}, "text"),
    ({"text": "x", "sampling_params": {"regex": "a+"}}, "sampling_params.regex"),
    ({"text": "x", "sampling_params": {"max_new_tokens": 10**6}}, "sampling_params.max_new_tokens"),
    ({"text": "x", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ({"text": "x", "sampling_params": {"json_schema": "{not json"}}, "sampling_params.json_schema"),
    ({"text": "x", "sampling_params": {"custom_params": {"expert_budget": 99}}}, "expert_budget"),
    ({"text": "x", "lora_path": "adapter"}, "lora_path"),
    ({"text": "x", "logprob_start_len": 3}, "logprob_start_len"),
])
def test_generate_errors_name_the_field(server, body, param):
    r = post(server, "/generate", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_generate_json_schema(server):
    pytest.importorskip("xgrammar")
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 9}}, "required": ["n"]}
    out = post(server, "/generate", {"text": "JSON:", "sampling_params": {
        "max_new_tokens": 40, "temperature": 0, "json_schema": json.dumps(schema)}}).json()
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert 0 <= json.loads(out["text"])["n"] <= 9

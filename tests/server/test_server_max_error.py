"""Error-targeted budgets over HTTP (native backend): "expert_budget": {"max_error": eps,
"max_experts": N} on completions and chat, streaming or not, through the official openai client."""

import json

import httpx
import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

from base_sglang.server.app import create_app
from base_sglang.server.backends import create_backend
from base_sglang.server.settings import Settings

MODEL = "tiny"  # served_model_name in conftest.py (8 experts, top-2, policy base)
PROMPT = "The quick brown fox"
GREEDY = {"max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def post(server, body, path="/v1/completions", headers=None):
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=60)


def test_a_bounded_completion_reports_its_bound(client):
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=PROMPT, **GREEDY, extra_body={"expert_budget": {"max_error": 0.05}})
    usage = raw.parse().usage.model_extra
    assert usage["expert_budget"] == {"max_error": 0.05, "max_experts": 8}  # the cap: E
    assert raw.headers["x-expert-budget"] == "dense" and raw.headers["x-expert-max-error"] == "0.05"
    assert 1 <= usage["experts_per_layer"] <= usage["experts_per_layer_dense"]


def test_bound_zero_is_the_dense_greedy_output(client):
    dense = client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY,
                                      extra_body={"expert_budget": "dense", "ignore_eos": True})
    bound = client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY, extra_body={
        "expert_budget": {"max_error": 0, "max_experts": 8}, "ignore_eos": True})
    assert bound.choices[0].text == dense.choices[0].text and bound.usage.completion_tokens == 8


def test_bound_one_capped_at_one_executes_one_expert_per_layer(client, server):
    metrics = httpx.get(f"{server.url}/metrics").text
    before = _counter(metrics, 'base_request_budget_total{budget="max_error"}')
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], **GREEDY,
        extra_body={"expert_budget": {"max_error": 1, "max_experts": 1}, "ignore_eos": True})
    usage = resp.usage.model_extra
    assert usage["expert_budget"] == {"max_error": 1.0, "max_experts": 1}
    assert usage["experts_per_layer"] == 1.0  # alone in its batch: M = 1 in every step
    metrics = httpx.get(f"{server.url}/metrics").text
    assert _counter(metrics, 'base_request_budget_total{budget="max_error"}') == before + 1
    assert 'budget="1.0"' not in metrics and 'budget="{' not in metrics  # labels stay bounded


def test_streaming_bounded_requests(client):
    chunks = list(client.completions.create(
        model=MODEL, prompt=PROMPT, **GREEDY, stream=True, stream_options={"include_usage": True},
        extra_body={"expert_budget": {"max_error": 0.2, "max_experts": 4}}))
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage.model_extra["expert_budget"] == {"max_error": 0.2, "max_experts": 4}
    assert chunks[-1].usage.model_extra["experts_per_layer"] <= 4
    chat = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], **GREEDY, stream=True,
        stream_options={"include_usage": True}, extra_body={"expert_budget": {"max_error": 0.1}}))
    assert chat[-1].usage.model_extra["expert_budget"] == {"max_error": 0.1, "max_experts": 8}


def test_the_body_bound_wins_over_the_header(server):
    r = post(server, {"model": MODEL, "prompt": "hi", "max_tokens": 2,
                      "expert_budget": {"max_error": 0.3, "max_experts": 2}},
             headers={"X-Expert-Budget": "5"})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["expert_budget"] == {"max_error": 0.3, "max_experts": 2}
    assert r.headers["x-expert-budget"] == "2"


BAD = [({"max_error": 1.5}, "expert_budget.max_error"),
       ({"max_error": -1}, "expert_budget.max_error"),
       ({"max_error": "0.1"}, "expert_budget.max_error"),
       ({"max_error": None}, "expert_budget.max_error"),
       ({"max_error": True}, "expert_budget.max_error"),
       ({"max_experts": 2}, "expert_budget.max_error"),
       ({"max_error": 0.1, "max_experts": 0}, "expert_budget.max_experts"),
       ({"max_error": 0.1, "max_experts": 9}, "expert_budget.max_experts"),
       ({"max_error": 0.1, "max_experts": "4"}, "expert_budget.max_experts"),
       ({"max_error": 0.1, "max_experts": 2.5}, "expert_budget.max_experts"),
       ({"max_error": 0.1, "max_experts": None}, "expert_budget.max_experts"),
       ({"max_error": 0.1, "budget": 4}, "expert_budget"),
       ({}, "expert_budget.max_error")]


@pytest.mark.parametrize("value, param", BAD)
@pytest.mark.parametrize("stream", [False, True])
def test_bad_bounds_are_400_naming_the_field(server, value, param, stream):
    for path, body in (("/v1/completions", {"prompt": "hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
        r = post(server, {"model": MODEL, "max_tokens": 2, "stream": stream, **body,
                          "expert_budget": value}, path)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["message"].startswith(param + ":")
        assert err["type"] == "invalid_request_error"


def test_non_finite_bounds_are_400(server):
    for text in ('{"max_error": NaN}', '{"max_error": Infinity}', '{"max_error": 1e999}'):
        body = f'{{"model": "{MODEL}", "prompt": "hi", "max_tokens": 2, "expert_budget": {text}}}'
        r = httpx.post(f"{server.url}/v1/completions", content=body,
                       headers={"Content-Type": "application/json"}, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"].startswith("expert_budget")


def test_the_header_takes_expert_counts_only(server):
    r = post(server, {"model": MODEL, "prompt": "hi", "max_tokens": 2},
             headers={"X-Expert-Budget": '{"max_error": 0.1}'})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Expert-Budget"


def test_a_server_budget_floor_refuses_bounds(server, settings_override):
    settings_override(min_budget=2)
    r = post(server, {"model": MODEL, "prompt": "hi", "max_tokens": 2,
                      "expert_budget": {"max_error": 0.1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "expert_budget.max_error"
    settings_override(max_budget=4)
    r = post(server, {"model": MODEL, "prompt": "hi", "max_tokens": 2,
                      "expert_budget": {"max_error": 0.1}})
    assert r.status_code == 200 and r.json()["usage"]["expert_budget"]["max_experts"] == 4


def test_a_policy_without_removal_cost_refuses_bounds(server_model_dir):
    settings = Settings(model=str(server_model_dir), served_model_name=MODEL, policy="gate_sum")
    with TestClient(create_app(create_backend(settings), settings)) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2,
                                            "expert_budget": {"max_error": 0.1}})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "expert_budget.max_error"
        assert "gate_sum" in err["message"] and "base_plus" in err["message"]
        assert c.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2,
                                                "expert_budget": 2}).status_code == 200


def test_generate_route_takes_expert_counts_only(server):
    r = post(server, {"text": "hi", "sampling_params": {
        "max_new_tokens": 2, "custom_params": {"expert_budget": {"max_error": 0.1}}}}, "/generate")
    assert r.status_code == 400 and "expert_budget" in r.json()["error"]["param"]


def test_openapi_documents_the_object_form(server):
    schema = httpx.get(f"{server.url}/openapi.json").json()
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        options = schema["components"]["schemas"][name]["properties"]["expert_budget"]["anyOf"]
        [bound] = [o for o in options if o.get("type") == "object"]
        assert bound["required"] == ["max_error"] and not bound["additionalProperties"]
        assert bound["properties"]["max_error"] == {"type": "number", "minimum": 0, "maximum": 1}
        assert bound["properties"]["max_experts"]["maximum"] == 8
    custom = schema["components"]["schemas"]["CustomParams"]["properties"]["expert_budget"]
    assert all(o.get("type") != "object" for o in custom["anyOf"])  # /generate: counts only


def _counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_streamed_chunks_are_json(server):
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": "hi", "max_tokens": 3, "stream": True,
            "expert_budget": {"max_error": 0.5}}) as r:
        assert r.status_code == 200 and r.headers["x-expert-max-error"] == "0.5"
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and all(json.loads(e) for e in events[:-1])


def test_the_shipped_proxy_under_bounds(proxy_server):
    """base-serve's defaults (the shipped proxy, base_plus, its calibrated predictor): bound 0 is
    the dense greedy output, a looser bound executes fewer experts, bound 1 capped at 1 runs one."""
    c = OpenAI(base_url=f"{proxy_server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    E = proxy_server.backend.num_experts

    def run(budget):
        r = c.completions.create(model="proxy-moe", prompt="def fibonacci(n):", max_tokens=12,
                                 temperature=0, extra_body={"expert_budget": budget,
                                                            "ignore_eos": True})
        return r.choices[0].text, r.usage.model_extra

    dense_text, dense = run("dense")
    text0, bound0 = run({"max_error": 0})
    assert text0 == dense_text and bound0["expert_budget"] == {"max_error": 0.0, "max_experts": E}
    assert bound0["experts_per_layer"] == dense["experts_per_layer_dense"]  # alone: all routed
    _, loose = run({"max_error": 0.2})
    assert 1 <= loose["experts_per_layer"] < dense["experts_per_layer_dense"]
    _, one = run({"max_error": 1, "max_experts": 1})
    assert one["experts_per_layer"] == 1.0

"""Every error case answers in OpenAI's error JSON with the right status and the field named."""

import httpx
import pytest

MODEL = "tiny"  # served_model_name in conftest.py

OK_BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 0}


def post(server, path="/v1/completions", json=None, headers=None, content=None):
    return httpx.post(f"{server.url}{path}", json=json, headers=headers, content=content, timeout=60)


def assert_error(r, status, param=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param and err["message"].startswith(param)
    return err


@pytest.mark.parametrize("header", ["abc", "0", "-2", "2.5", "99"])
def test_bad_budget_header(server, header):
    assert_error(post(server, json=OK_BODY, headers={"X-Expert-Budget": header}), 400,
                 "X-Expert-Budget")


@pytest.mark.parametrize("value", [0, 9, True, 1.5, "lots", [2]])
def test_bad_budget_body(server, value):
    assert_error(post(server, json={**OK_BODY, "expert_budget": value}), 400, "expert_budget")
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "expert_budget": value}
    assert_error(post(server, "/v1/chat/completions", json=chat), 400, "expert_budget")


def test_body_budget_wins_but_a_bad_header_is_still_refused(server):
    assert_error(post(server, json={**OK_BODY, "expert_budget": "Dense"},
                      headers={"X-Expert-Budget": "x"}), 400, "X-Expert-Budget")
    r = post(server, json={**OK_BODY, "expert_budget": "Dense"}, headers={"X-Expert-Budget": "2"})
    assert r.status_code == 200 and r.headers["x-expert-budget"] == "dense"
    r = post(server, json={**OK_BODY, "expert_budget": 8})  # E itself is dense
    assert r.status_code == 200 and r.json()["usage"]["expert_budget"] == "dense"


def test_budget_outside_the_allowed_range(server, settings_override):
    settings_override(min_budget=2, max_budget=4)
    assert_error(post(server, json={**OK_BODY, "expert_budget": 1}), 400, "expert_budget")
    assert_error(post(server, json=OK_BODY, headers={"X-Expert-Budget": "dense"}), 400,
                 "X-Expert-Budget")
    assert post(server, json={**OK_BODY, "expert_budget": 4}).status_code == 200


@pytest.mark.parametrize("change,param", [
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"n": 0}, "n"),
    ({"n": 129}, "n"), ({"n": 17}, "n"),  # 17 choices exceed the 16 running sequences
    ({"max_tokens": 100000}, "max_tokens"), ({"max_tokens": -1}, "max_tokens"),
    ({"prompt": []}, "prompt"), ({"prompt": [10**7]}, "prompt"), ({"logprobs": 50}, "logprobs"),
    ({"stop": [""]}, "stop"), ({"model": None}, "model"),
])
def test_bad_completion_parameter(server, change, param):
    assert_error(post(server, json={**OK_BODY, **change}), 400, param)


def test_bad_chat_parameter(server):
    base = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    assert_error(post(server, "/v1/chat/completions", json={**base, "messages": []}), 400,
                 "messages")
    bad_role = {**base, "messages": [{"role": "wizard", "content": "x"}]}
    assert_error(post(server, "/v1/chat/completions", json=bad_role), 400, "messages.0.role")
    image = {**base, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
    assert_error(post(server, "/v1/chat/completions", json=image), 400, "messages.0.content")


def test_unknown_model_is_404(server):
    err = assert_error(post(server, json={**OK_BODY, "model": "gpt-17"}), 404, "model")
    assert err["code"] == "model_not_found"


def test_malformed_json_is_400(server):
    r = post(server, content=b'{"model": "tiny", "prompt": ', headers={"Content-Type": "application/json"})
    assert_error(r, 400)
    assert_error(post(server, json=["not", "an", "object"]), 400)


def test_unknown_route_is_404_json(server):
    assert_error(httpx.get(f"{server.url}/v1/nothing-here"), 404)


def test_missing_api_key_is_401(server, settings_override):
    settings_override(api_key="k")
    assert_error(post(server, json=OK_BODY), 401)
    assert_error(post(server, json=OK_BODY, headers={"Authorization": "Bearer nope"}), 401)
    assert post(server, json=OK_BODY, headers={"Authorization": "Bearer k"}).status_code == 200

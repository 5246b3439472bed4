"""tools / tool_choice through the official openai client.

On the live tiny model with a Qwen-style tools template (conftest.tools_server): tools reach the
prompt; tool_choice "required" and a named function constrain the output by grammar and come back
as tool_calls whose arguments validate against the tool's parameters; "none" and "auto" answer
text. The tiny model never writes <tool_call> blocks by itself, so the "auto" parse (non-streaming
and streamed deltas) is driven by `ScriptedBackend`, a minimal backend that replays a fixed model
output through the real app (the parser itself is checked against SGLang's in tests/engine).
"""

import json

import httpx
import jsonschema
import pytest
from fastapi.testclient import TestClient
from openai import BadRequestError, OpenAI
from transformers import AutoTokenizer

from base_sglang.protocol import RequestOutput
from base_sglang.server.app import create_app
from base_sglang.server.settings import Settings
from base_sglang.testing.tool_call_cases import TOOLS

pytest.importorskip("xgrammar")
MODEL = "tiny"  # served_model_name in conftest.py
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# bounded arguments: a random model under the call grammar finishes within max_tokens
BOUNDED = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}},
           {"type": "function", "function": {"name": "add", "parameters": {
               "type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                      "maximum": 99},
                                                "b": {"type": "integer", "minimum": 0,
                                                      "maximum": 99}},
               "required": ["a", "b"], "additionalProperties": False}}}]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in BOUNDED}


def client_of(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_tools_need_a_template_that_renders_them(server):
    c = client_of(server)  # the tiny model's plain ChatML template
    with pytest.raises(BadRequestError, match="^Error code: 400 .*tools: this model's chat") as e:
        c.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=2)
    assert e.value.body["param"] == "tools" and e.value.body["code"] == "tools_not_supported"
    with pytest.raises(BadRequestError, match="tool_choice: only allowed when tools"):
        c.chat.completions.create(model=MODEL, messages=ASK, tool_choice="auto", max_tokens=2)
    ok = c.chat.completions.create(model=MODEL, messages=ASK, tool_choice="none", max_tokens=2)
    assert ok.choices[0].message.tool_calls in (None, [])


def test_tools_are_rendered_into_the_prompt(tools_server):
    url = tools_server.url
    body = {"model": MODEL, "messages": ASK}
    plain = httpx.post(f"{url}/tokenize", json=body, timeout=30).json()
    with_tools = httpx.post(f"{url}/tokenize", json={**body, "tools": TOOLS}, timeout=30).json()
    text = httpx.post(f"{url}/detokenize", json={"model": MODEL, "tokens": with_tools["tokens"]},
                      timeout=30).json()["prompt"]
    assert '"name": "get_weather"' in text and "<tools>" in text and with_tools["count"] > \
        plain["count"]
    resp = client_of(tools_server).chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=3, temperature=0)
    assert resp.usage.prompt_tokens == with_tools["count"]  # the same rendering
    assert resp.choices[0].message.tool_calls == []
    assert resp.choices[0].finish_reason in ("stop", "length")


def _check_calls(calls, names):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_required_and_named_are_constrained_to_calls(tools_server):
    c = client_of(tools_server)
    kw = dict(model=MODEL, messages=ASK, tools=BOUNDED, max_tokens=200, temperature=0.8, seed=2,
              parallel_tool_calls=False)  # one call each (maxItems 1): bounded length
    required = c.chat.completions.create(tool_choice="required", n=2, **kw)
    for choice in required.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        _check_calls(choice.message.tool_calls, PARAMS)
    named = c.chat.completions.create(
        tool_choice={"type": "function", "function": {"name": "add"}}, **kw).choices[0]
    assert named.finish_reason == "stop"  # OpenAI: a forced function ends with "stop"
    _check_calls(named.message.tool_calls, ["add"])
    assert len(named.message.tool_calls) == 1


def test_required_streams_the_calls_when_they_are_complete(tools_server):
    c = client_of(tools_server)
    kw = dict(model=MODEL, messages=ASK, tools=BOUNDED, tool_choice="required", max_tokens=200,
              temperature=0, parallel_tool_calls=False)
    full = c.chat.completions.create(**kw).choices[0]
    chunks = list(c.chat.completions.create(**kw, stream=True))
    deltas = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert [(d.function.name, d.function.arguments) for d in deltas] == \
        [(t.function.name, t.function.arguments) for t in full.message.tool_calls]
    assert [d.index for d in deltas] == list(range(len(deltas)))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(ch.choices[0].delta.content for ch in chunks)


def test_auto_and_history_with_tool_turns(tools_server):
    """auto on a model that answers in text: plain content; earlier tool calls and tool results
    in the messages render (arguments handed to the template as a mapping)."""
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    resp = client_of(tools_server).chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, max_tokens=6, temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls == []
    assert isinstance(choice.message.content, str)


@pytest.mark.parametrize("change,param", [
    ({"tools": TOOLS + TOOLS[:1]}, "tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
     "tools.0.function.name"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "frobnicate"}}}], "tool_choice": "required"}, "tools"),
])
def test_bad_tool_requests_name_the_field(tools_server, change, param):
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 4, **change}
    r = httpx.post(f"{tools_server.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


# ---- the auto parse, on a replayed output -----------------------------------------------------
CALLED = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
          '\n</tool_call>\n<tool_call>\n{"name": "search", "arguments": {"query": "umbrella"}}'
          '\n</tool_call>')


class ScriptedBackend:
    """A backend that answers every request with `text`, in pieces of `chunk` characters."""

    name, num_experts, policy, capacity, max_model_len = MODEL, 8, "dense", None, 4096

    def __init__(self, tokenizer, text: str, chunk: int = 5):
        self.tokenizer, self.text, self.chunk = tokenizer, text, chunk

    async def start(self): ...
    async def stop(self): ...
    def abort(self, request_id): ...
    def abort_all(self, error): return 0
    def compile_grammar(self, params): ...
    def error_status(self, error): return 500
    def stats(self): return {"num_requests_running": 0, "num_requests_waiting": 0,
                             "engine": None}
    def describe(self): return {"backend": "scripted"}

    def generate(self, prompt_ids, params, budget, request_id):
        async def stream():
            pieces = [self.text[i:i + self.chunk] for i in range(0, len(self.text), self.chunk)]
            for k, piece in enumerate(pieces):
                last = k == len(pieces) - 1
                yield RequestOutput(request_id, [k], piece, None, None, last,
                                    "stop" if last else None, len(prompt_ids), k + 1, budget,
                                    None, None)
        return stream()


@pytest.fixture
def scripted(tools_server):
    tok = AutoTokenizer.from_pretrained(tools_server.model_dir)  # the tools template

    def client(text):
        app = create_app(ScriptedBackend(tok, text), Settings(model=tools_server.model_dir))
        http = TestClient(app)
        return OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                      max_retries=0)

    return client


def test_auto_parses_calls_whole_and_streamed(scripted):
    c = scripted(CALLED)
    full = c.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS).choices[0]
    assert full.finish_reason == "tool_calls" and full.message.content == "Let me check."
    assert [(t.function.name, json.loads(t.function.arguments)) for t in
            full.message.tool_calls] == [("get_weather", {"city": "Paris"}),
                                         ("search", {"query": "umbrella"})]
    chunks = list(c.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, stream=True))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    deltas = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert content.strip() == "Let me check." and "<tool_call>" not in content
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas] == [
        (i, t.function.name, t.function.arguments) for i, t in enumerate(full.message.tool_calls)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_without_calls_is_plain_text_and_none_never_parses(scripted):
    c = scripted("It is sunny in Paris.")
    r = c.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS).choices[0]
    assert r.message.content == "It is sunny in Paris." and r.finish_reason == "stop"
    none = scripted(CALLED).chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                                    tool_choice="none").choices[0]
    assert none.message.content == CALLED and none.message.tool_calls == []
    assert none.finish_reason == "stop"

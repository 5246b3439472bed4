"""response_format through the official openai client: json_object and json_schema (chat, and
completions as an extension), streaming and not, on the tiny model and on the embedded proxy; the
output parses and validates against the schema (jsonschema); schemas the grammar library rejects
are a 400 naming response_format."""

import json

import jsonschema
import pytest
from openai import BadRequestError, OpenAI
from pydantic import BaseModel, Field

pytest.importorskip("xgrammar")

MODEL = "tiny"  # served_model_name in conftest.py
RECORD = {"type": "object", "additionalProperties": False,
          "properties": {"name": {"type": "string", "maxLength": 16},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "color": {"enum": ["red", "green", "blue"]},
                         "tags": {"type": "array", "maxItems": 3,
                                  "items": {"type": "string", "maxLength": 8}}},
          "required": ["name", "age", "color", "tags"]}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "record", "schema": RECORD,
                                                        "strict": True}}
MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]


def client_of(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_json_schema_validates(server):
    c = client_of(server)
    for temperature in (0.0, 1.0):
        resp = c.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, max_tokens=120,
                                         temperature=temperature, seed=4,
                                         response_format=SCHEMA_FORMAT)
        for choice in resp.choices:
            assert choice.finish_reason == "stop", choice.message.content
            jsonschema.validate(json.loads(choice.message.content), RECORD)


def test_chat_json_schema_streams_the_same_json(server):
    c = client_of(server)
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=120, temperature=0,
              response_format=SCHEMA_FORMAT)
    full = c.chat.completions.create(**kw).choices[0].message.content
    text = "".join(ch.choices[0].delta.content or "" for ch in
                   c.chat.completions.create(**kw, stream=True))
    assert text == full
    jsonschema.validate(json.loads(text), RECORD)


def test_json_object_and_completions_extension(server):
    c = client_of(server)
    chat = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=60,
                                     temperature=0.8, seed=1,
                                     response_format={"type": "json_object"})
    if chat.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(chat.choices[0].message.content), dict)
    else:  # cut by max_tokens: a prefix of a JSON object, reported as "length"
        assert chat.choices[0].finish_reason == "length"
        assert chat.choices[0].message.content.startswith("{")
    text = c.completions.create(model=MODEL, prompt="JSON: ", max_tokens=120, temperature=0,
                                extra_body={"response_format": SCHEMA_FORMAT}).choices[0].text
    jsonschema.validate(json.loads(text), RECORD)
    plain = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8,
                                      temperature=0, response_format={"type": "text"})
    assert plain.choices[0].message.content is not None  # "text" = no constraint


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)
    admin: bool


def test_openai_parse_helper(server):
    """client.chat.completions.parse(response_format=PydanticModel): the client writes the
    json_schema (strict) and parses the answer into the model."""
    resp = client_of(server).chat.completions.parse(
        model=MODEL, messages=MESSAGES, max_tokens=80, temperature=0, response_format=Person)
    person = resp.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120


@pytest.mark.parametrize("fmt,match", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}},
     "response_format: the JSON schema is not supported"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}},
     "response_format: the JSON schema is not supported"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format: json_schema needs"),
    ({"type": "yaml"}, "response_format: must be an object with type"),
    ({"type": "json_object", "schema": {}}, "response_format: unknown field 'schema'"),
])
def test_bad_response_format_is_a_400_naming_it(server, fmt, match):
    with pytest.raises(BadRequestError, match=match) as info:
        client_of(server).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4,
                                                  response_format=fmt)
    assert info.value.body["param"] == "response_format"


def test_the_grammar_end_wins_over_min_tokens(server):
    """min_tokens past the end of the only JSON the schema allows: the JSON ends it (as vLLM)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"const": 1}}}
    resp = client_of(server).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=20, response_format=fmt,
        extra_body={"min_tokens": 10})
    assert resp.choices[0].message.content == "1" and resp.choices[0].finish_reason == "stop"


def test_embedded_model_json_schema(proxy_server):
    """The shipped proxy under base-serve's defaults (policy base, dense default) and budget 8."""
    c = OpenAI(base_url=f"{proxy_server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    for budget in ("dense", 8):
        resp = c.chat.completions.create(
            model="proxy-moe", messages=MESSAGES, n=2, max_tokens=160, temperature=0.7, seed=3,
            response_format=SCHEMA_FORMAT, extra_body={"expert_budget": budget})
        for choice in resp.choices:
            assert choice.finish_reason == "stop", choice.message.content
            jsonschema.validate(json.loads(choice.message.content), RECORD)
        assert resp.usage.model_extra["expert_budget"] == budget

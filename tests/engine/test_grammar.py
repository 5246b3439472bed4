"""response_format on the shipped proxy model (64 experts, byte-level BPE tokenizer.json): the
output parses and validates against the schema, greedy and sampled, several choices, small
budgets; compilation is cached per (engine tokenizer, schema); bad schemas name the field."""

import json

import jsonschema
import pytest
import torch

from base_sglang.engine import DEFAULT_MODEL_DIR, EngineConfig, LLMEngine, SamplingParams
from base_sglang.protocol import ResponseFormat

pytest.importorskip("xgrammar")
pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL_DIR / "config.json").is_file(),
                                reason="the embedded proxy model is not installed")

SCHEMAS = {
    "flat": {"type": "object", "additionalProperties": False,
             "properties": {"name": {"type": "string", "maxLength": 24},
                            "age": {"type": "integer", "minimum": 0, "maximum": 150},
                            "color": {"enum": ["red", "green", "blue"]}},
             "required": ["name", "age", "color"]},
    "array": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 6},
    "nested": {"type": "object",
               "properties": {"user": {"type": "object",
                                       "properties": {"id": {"type": "integer", "minimum": 1,
                                                             "maximum": 99999},
                                                      "tags": {"type": "array", "maxItems": 3,
                                                               "items": {"type": "string",
                                                                         "maxLength": 12}},
                                                      "admin": {"type": "boolean"}},
                                       "required": ["id", "tags", "admin"]},
                              "score": {"type": "number", "minimum": 0, "maximum": 1}},
               "required": ["user", "score"]},
}
PROMPTS = ["Here is the record as JSON:\n", "import json\nx = ", "{\""]


@pytest.fixture(scope="module")
def proxy():
    torch.set_num_threads(1)
    return LLMEngine(EngineConfig(max_running_requests=16, num_threads=1))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_output_validates_against_the_schema(proxy, name):
    fmt = ResponseFormat.create("json_schema", SCHEMAS[name])
    for temperature, budget in ((0.0, "dense"), (1.0, 4)):
        params = SamplingParams(temperature=temperature, max_tokens=160, seed=7, n=2,
                                response_format=fmt)
        for choices in proxy.generate_choices(PROMPTS, params, budget):
            for ids, text, last in choices:
                assert last.finish_reason == "stop" and last.error is None, text
                jsonschema.validate(json.loads(text), SCHEMAS[name])
                assert ids[-1] in proxy.eos_ids  # the grammar ended on EOS


def test_json_object_and_unconstrained_neighbours(proxy):
    """json_object: every output that ends ("stop") is a JSON object; a plain request in the same
    batch is not constrained (dense: its tokens do not depend on its neighbours). Object keys and values are unbounded here, and the proxy can keep
    writing one (reported as "length", like OpenAI): bounded schemas are what make it finish."""
    fmt = ResponseFormat.create("json_object")
    rids = [proxy.add_request(p, SamplingParams(temperature=0.0, max_tokens=200,
                                                response_format=fmt), "dense") for p in PROMPTS]
    plain = proxy.add_request("def f(x):", SamplingParams(temperature=0.0, max_tokens=24,
                                                          ignore_eos=True), "dense")
    texts, reasons = {}, {}
    while proxy.has_unfinished():
        for out in proxy.step():
            texts[out.request_id] = texts.get(out.request_id, "") + out.text
            if out.finished:
                assert out.error is None
                reasons[out.request_id] = out.finish_reason
    ended = [r for r in rids if reasons[r] == "stop"]
    assert len(ended) >= 2 and all(reasons[r] == "length" for r in rids if r not in ended)
    for rid in ended:
        assert isinstance(json.loads(texts[rid]), dict)
    solo = proxy.generate(["def f(x):"], SamplingParams(temperature=0.0, max_tokens=24,
                                                        ignore_eos=True), "dense")[0][1]
    assert texts[plain] == solo


def test_grammar_compilation_is_cached(proxy):
    schema = {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}
    before = proxy.grammar.num_compiled
    for _ in range(3):
        proxy.compile_grammar(SamplingParams(
            response_format=ResponseFormat.create("json_schema", json.dumps(schema))))
    assert proxy.grammar.num_compiled == before + 1


def test_length_cut_is_reported_not_hidden(proxy):
    fmt = ResponseFormat.create("json_schema", SCHEMAS["nested"])
    [(ids, _, last)] = proxy.generate(["{"], SamplingParams(temperature=0.0, max_tokens=3,
                                                           response_format=fmt), "dense")
    assert last.finish_reason == "length" and len(ids) == 3


@pytest.mark.parametrize("schema", [{"type": "frobnicate"}, {"$ref": "#/nowhere"},
                                    {"type": "string", "pattern": "(unclosed"}])
def test_rejected_schema_is_a_response_format_error(proxy, schema):
    fmt = ResponseFormat.create("json_schema", schema)
    with pytest.raises(ValueError, match="^response_format: the JSON schema is not supported"):
        proxy.add_request("x", SamplingParams(response_format=fmt))
    assert not proxy.has_unfinished()

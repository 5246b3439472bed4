"""JSON strings under a length bound never contain raw control characters (an xgrammar 0.2.x
quirk the compiler corrects: engine.grammar.without_raw_controls), on the tiny model whose byte
tokens include them."""

import json

import pytest

from base_sglang.engine import SamplingParams
from base_sglang.engine.grammar import without_raw_controls
from base_sglang.protocol import ResponseFormat

xgr = pytest.importorskip("xgrammar")
BOUNDED = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 12},
                                            "b": {"type": "string", "minLength": 3}},
           "required": ["a", "b"], "additionalProperties": False}


def test_bounded_string_classes_exclude_controls():
    loose = xgr.Grammar.from_json_schema(json.dumps(BOUNDED), any_whitespace=False,
                                         strict_mode=True)
    assert '[^\\"\\\\\\r\\n]' in str(loose)  # what xgrammar writes
    fixed = str(without_raw_controls(loose))
    assert '[^\\"\\\\\\r\\n]' not in fixed and fixed.count('[^\\0-\\x1f\\"\\\\\\r\\n]') >= 3


def test_control_tokens_are_masked_inside_bounded_strings(engine):
    tok = engine.tokenizer
    control = [i for i in range(len(tok)) if any(ord(c) < 32 for c in tok.decode([i]))]
    assert control  # the byte-level vocabulary has them
    fmt = ResponseFormat.create("json_schema", BOUNDED)
    params = SamplingParams(temperature=1.0, max_tokens=80, seed=0, n=4, response_format=fmt,
                            logit_bias={t: 30.0 for t in control[:50]})  # push them hard
    for _, text, last in engine.generate_choices(['{"a": "'], params, "dense")[0]:
        if last.finish_reason == "stop":
            value = json.loads(text)  # strict: raw control characters would raise
            assert len(value["a"]) <= 12 and len(value["b"]) >= 3
        assert not any(ord(c) < 32 for c in text), text

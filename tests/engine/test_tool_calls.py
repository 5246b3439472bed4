"""Tool-call parsing (Qwen2.5 / Qwen3 format) against the cases SGLang's parser is checked on, the
streaming parser against the one-shot, and the tools check of chat templates."""

import shutil

import pytest
from transformers import AutoTokenizer

from base_sglang.engine import DEFAULT_MODEL_DIR
from base_sglang.engine.tool_calls import (
    QWEN25,
    ToolCallStream,
    parse_tool_calls,
    supports_tools,
    tool_call_format,
)
from base_sglang.testing.tool_call_cases import CASES, QWEN_STYLE_TEMPLATE, TOOLS


@pytest.mark.parametrize("name,text,normal,calls", CASES, ids=[c[0] for c in CASES])
def test_one_shot_parse_matches_sglang_cases(name, text, normal, calls):
    got_text, got = parse_tool_calls(text, TOOLS)
    assert got_text == normal
    assert [(c.name, c.arguments, c.tool_index) for c in got] == calls


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
@pytest.mark.parametrize("name,text,normal,calls", CASES, ids=[c[0] for c in CASES])
def test_streaming_parse_equals_one_shot(name, text, normal, calls, chunk):
    stream, streamed, got = ToolCallStream(TOOLS), "", []
    for i in range(0, len(text), chunk):
        delta, done = stream.feed(text[i:i + chunk])
        streamed += delta
        got += done
        assert "<tool_call>\n" not in streamed
    streamed += stream.finish()
    assert streamed.strip() == normal.strip()
    assert [(c.name, c.arguments, c.tool_index) for c in got] == calls


def test_non_object_block_is_dropped_not_raised():
    assert parse_tool_calls("<tool_call>\n42\n</tool_call>", TOOLS) == ("", [])


@pytest.fixture(scope="module")
def proxy_tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)


def test_the_proxy_model_has_no_tool_template(proxy_tokenizer):
    assert tool_call_format(proxy_tokenizer) is None and not supports_tools(proxy_tokenizer)


def test_a_qwen_style_template_supports_tools(proxy_tokenizer, tmp_path):
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(DEFAULT_MODEL_DIR / f, tmp_path / f)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    tok.chat_template = QWEN_STYLE_TEMPLATE
    assert tool_call_format(tok) == QWEN25 and supports_tools(tok)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}],
                                     tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert '"name": "get_weather"' in prompt and prompt.endswith("<|im_start|>assistant\n")
    # a template that mentions <tool_call> but never renders the tools is not enough
    tok.chat_template = "{# <tool_call> #}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert tool_call_format(tok) == QWEN25 and not supports_tools(tok)
    tok.chat_template = {"default": proxy_tokenizer.chat_template, "tool_use": QWEN_STYLE_TEMPLATE}
    assert tool_call_format(tok) == QWEN25

"""Model outputs in the Qwen2.5 / Qwen3 tool-call format and what SGLang 0.5.23's Qwen25Detector
makes of them (tests/plugin/test_tool_calls_sglang.py checks these against the real detector,
tests/engine/test_tool_calls.py checks base_sglang.engine.tool_calls against them)."""

from __future__ import annotations

# A chat template in the Qwen2.5 style, written for the tests: tools listed in the system turn
# inside <tools></tools>, calls written as <tool_call>\n{json}\n</tool_call>.
QWEN_STYLE_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call these tools:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    "Answer a call as <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call><|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _tool(name: str, **props) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": f"{name} tool",
        "parameters": {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}}}}


TOOLS = [_tool("get_weather", city="string", unit="string"), _tool("search", query="string"),
         _tool("add", a="integer", b="integer")]

W = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
S = '{"name": "search", "arguments": {"query": "moe routing"}}'
W_ARGS = '{"city": "Paris", "unit": "celsius"}'
S_ARGS = '{"query": "moe routing"}'

# (name, model output, expected normal text, expected calls as (name, arguments JSON, tool index))
CASES = [
    ("no_call", "The weather is fine.\n", "The weather is fine.\n", []),
    ("one_call", f"Let me check.\n<tool_call>\n{W}\n</tool_call>", "Let me check.",
     [("get_weather", W_ARGS, 0)]),
    ("two_calls", f"<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{S}\n</tool_call>", "",
     [("get_weather", W_ARGS, 0), ("search", S_ARGS, 1)]),
    ("unknown_tool", f'<tool_call>\n{{"name": "rm_rf", "arguments": {{}}}}\n</tool_call>\n'
     f"<tool_call>\n{S}\n</tool_call>", "", [("search", S_ARGS, 1)]),
    ("bad_json_block", f"ok <tool_call>\n{{not json}}\n</tool_call>\n<tool_call>\n{S}\n</tool_call>",
     "ok", [("search", S_ARGS, 1)]),
    ("parameters_key", '<tool_call>\n{"name": "add", "parameters": {"a": 1, "b": 2}}\n</tool_call>',
     "", [("add", '{"a": 1, "b": 2}', 2)]),
    ("list_in_block", f"<tool_call>\n[{W}, {S}]\n</tool_call>", "",
     [("get_weather", W_ARGS, 0), ("search", S_ARGS, 1)]),
    ("non_ascii", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n'
     "</tool_call>", "", [("get_weather", '{"city": "Zürich"}', 0)]),
    ("unclosed", f"Checking  \n<tool_call>\n{W}", "Checking", []),
    ("text_after_calls", f"Sure.\n<tool_call>\n{S}\n</tool_call>\nDone, anything else?", "Sure.",
     [("search", S_ARGS, 1)]),
    ("no_newline_after_tag", f"<tool_call>{W}</tool_call>", f"<tool_call>{W}</tool_call>", []),
    ("empty_arguments", '<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>', "",
     [("search", "{}", 1)]),
    ("no_arguments", '<tool_call>\n{"name": "search"}\n</tool_call>', "", [("search", "{}", 1)]),
    ("nested_arguments", '<tool_call>\n{"name": "add", "arguments": {"a": [1, {"x": null}], '
     '"b": true}}\n</tool_call>', "", [("add", '{"a": [1, {"x": null}], "b": true}', 2)]),
    ("padded_json", f"<tool_call>\n   {S}  \n\n</tool_call>", "", [("search", S_ARGS, 1)]),
    ("multiline_json", '<tool_call>\n{\n  "name": "add",\n  "arguments": {"a": 1, "b": 2}\n}\n'
     "</tool_call>", "", [("add", '{"a": 1, "b": 2}', 2)]),
]

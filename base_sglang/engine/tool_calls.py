"""Tool calls in chat: whether a model's chat template takes tools, and parsing the calls it writes.

The format parsed is Qwen2.5's and Qwen3's (hermes style), what SGLang's `qwen` / `qwen25` tool-call
parser (sglang.srt.function_call.qwen25_detector.Qwen25Detector) reads:

    text before<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>\\n<tool_call>\\n...

SGLang's parser is SGLang code, not a library (it needs sglang's OpenAI protocol module, orjson and
partial_json_parser), so the one-shot parse below re-implements Qwen25Detector.detect_and_parse of
sglang 0.5.23 and is tested against it on the same strings (base_sglang/testing/tool_call_cases.py,
tests/plugin/test_tool_calls_sglang.py): normal text = what precedes the first "<tool_call>\\n",
stripped (everything if there is none); every "<tool_call>\\n ... \\n</tool_call>" block is JSON,
an object or a list of objects; blocks that are not JSON and calls of tools not in the request
are dropped; arguments = json.dumps of "parameters" or else "arguments" (ensure_ascii=False).
One difference: SGLang raises on a block whose JSON is not an object (e.g. a number); it is
dropped here. The streaming parser emits each call whole when its closing tag arrives (SGLang
streams the arguments piecewise); put together, its calls equal the one-shot parse.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

QWEN25 = "qwen25"
BOT, EOT = "<tool_call>\n", "\n</tool_call>"
_BLOCK = re.compile(rf"{re.escape(BOT)}(.*?){re.escape(EOT)}", re.DOTALL)
_PROBE = "base_sglang_probe_tool"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text
    tool_index: int  # position of the tool in the request's `tools`


def tool_call_format(tokenizer) -> str | None:
    """The tool-call format of a tokenizer's chat template (QWEN25), or None if it has none."""
    source = _template_source(tokenizer)
    return QWEN25 if "<tool_call>" in source else None


def supports_tools(tokenizer) -> bool:
    """True if the chat template renders a request's `tools` and writes calls in a format parsed
    here; the server answers 400 for `tools` otherwise (e.g. the embedded proxy model)."""
    if tool_call_format(tokenizer) is None:
        return False
    probe = [{"type": "function", "function": {
        "name": _PROBE, "description": "probe", "parameters": {"type": "object", "properties": {}}}}]
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=probe,
                                             tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that cannot take tools at all
        return False
    return isinstance(text, str) and _PROBE in text


def tool_names(tools: list[dict]) -> list[str]:
    """Function names of an OpenAI `tools` list ([{"type": "function", "function": {...}}])."""
    return [(t.get("function") or {}).get("name") or "" for t in tools]


def parse_tool_calls(text: str, tools: list[dict]) -> tuple[str, list[ToolCall]]:
    """The whole output -> (normal text, tool calls), as SGLang's Qwen25Detector."""
    idx = text.find(BOT)
    if idx == -1:
        return text, []
    index = {name: i for i, name in enumerate(tool_names(tools)) if name}
    calls = []
    for body in _BLOCK.findall(text):
        calls += _calls_of(body, index)
    return text[:idx].strip(), calls


def _calls_of(body: str, index: dict[str, int]) -> list[ToolCall]:
    try:
        obj = json.loads(body.strip())
    except ValueError:
        return []
    out = []
    for act in obj if isinstance(obj, list) else [obj]:
        if not isinstance(act, dict):
            continue
        name = act.get("name")
        if not (isinstance(name, str) and name in index):
            continue
        args = act.get("parameters") or act.get("arguments", {})
        out.append(ToolCall(name, json.dumps(args, ensure_ascii=False), index[name]))
    return out


class ToolCallStream:
    """Incremental parse of a streamed output: feed(text delta) -> (normal text delta, calls that
    completed). Text that may be the start of "<tool_call>\\n" is held back; after the first call
    begins, only calls come out (text between and after calls is dropped, as in the one-shot)."""

    def __init__(self, tools: list[dict]):
        self.index = {name: i for i, name in enumerate(tool_names(tools)) if name}
        self.buffer = ""
        self.in_calls = False

    def feed(self, delta: str) -> tuple[str, list[ToolCall]]:
        self.buffer += delta
        text = ""
        if not self.in_calls:
            idx = self.buffer.find(BOT)
            if idx == -1:
                keep = _partial_suffix(self.buffer, BOT)
                text, self.buffer = self.buffer[:len(self.buffer) - keep], self.buffer[len(self.buffer) - keep:]
                return text, []
            text, self.buffer, self.in_calls = self.buffer[:idx], self.buffer[idx:], True
        calls = []
        while (m := _BLOCK.search(self.buffer)) is not None:
            calls += _calls_of(m.group(1), self.index)
            self.buffer = self.buffer[m.end():]
        return text, calls

    def finish(self) -> str:
        """End of output: the held-back text if no call started (else nothing)."""
        text, self.buffer = ("" if self.in_calls else self.buffer), ""
        return text


def _partial_suffix(text: str, token: str) -> int:
    """Length of the longest end of text that is a proper prefix of token."""
    for n in range(min(len(token) - 1, len(text)), 0, -1):
        if text.endswith(token[:n]):
            return n
    return 0


def _template_source(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates (e.g. "default", "tool_use")
        return "\n".join(str(v) for v in template.values())
    return template if isinstance(template, str) else ""

"""Tool calling in chat: which tools a request offers, how its tool_choice constrains the output,
and the model's output as OpenAI `tool_calls` (whole, or as streamed deltas).

tool_choice (OpenAI's semantics, SGLang's mechanics):
- "none": the tools are rendered into the prompt, the output is plain text (nothing is parsed);
- "auto" (the default when tools are given): the output is parsed for calls in the chat template's
  format (engine.tool_calls: Qwen2.5 / Qwen3 `<tool_call>` blocks, as SGLang's qwen25 parser);
  finish_reason "tool_calls" when it made any;
- "required" / a named function: the output is constrained by a JSON-Schema grammar to a JSON
  array of calls [{"name": ..., "parameters": {...}}, ...] (SGLang's `get_json_schema_constraint`
  for parsers without a structural tag: at least one call, of any tool / of the named one; at most
  one with parallel_tool_calls false), parsed into tool_calls. finish_reason: "tool_calls" for
  required, "stop" for a named function (as OpenAI).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from base_sglang.engine.tool_calls import ToolCall, ToolCallStream, parse_tool_calls
from base_sglang.protocol import ResponseFormat
from base_sglang.server.errors import APIError
from base_sglang.server.schemas import DeltaFunction, DeltaToolCall, NamedToolChoice
from base_sglang.server.schemas import ToolCall as ToolCallOut

NO_TOOLS = ("tools: this model's chat template does not render tools (no tool-call format this "
            "server parses); send the request without tools")


@dataclass(frozen=True)
class ToolSetup:
    """The tools of one chat request and what its tool_choice asks for."""

    tools: list[dict] = field(default_factory=list)  # OpenAI tool objects, for the template
    mode: str = "off"  # off (no tools) | none | auto | required | named
    parallel: bool = True

    @classmethod
    def create(cls, body, template_supports_tools: bool) -> ToolSetup:
        tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
        if not tools:
            return cls()
        if not template_supports_tools:
            raise APIError(400, NO_TOOLS, param="tools", code="tools_not_supported")
        choice = body.tool_choice  # a named function is one of tools (checked in schemas)
        mode = "named" if isinstance(choice, NamedToolChoice) else (choice or "auto")
        return cls(tools, mode, body.parallel_tool_calls is not False)

    def constraint(self, body) -> ResponseFormat | None:
        """The grammar of required / named (None otherwise: the body's response_format holds)."""
        if self.mode == "required":
            items = {"type": "object", "anyOf": [_call_schema(t) for t in self.tools]}
        elif self.mode == "named":
            name = body.tool_choice.function.name
            [tool] = [t for t in self.tools if t["function"]["name"] == name]
            items = _call_schema(tool)
        else:
            return None
        schema: dict = {"type": "array", "minItems": 1, "items": items}
        if not self.parallel:
            schema["maxItems"] = 1
        defs = _defs(self.tools)
        if defs:
            schema["$defs"] = defs
        return ResponseFormat.create("json_schema", schema)

    def rename(self, message: str) -> str:
        """A grammar error of a tool constraint names `tools` (their parameters schemas)."""
        if self.mode in ("required", "named") and message.startswith("response_format:"):
            return "tools:" + message.removeprefix("response_format:")
        return message

    def finish_reason(self, reason: str | None, calls: list) -> str | None:
        if self.mode == "auto" and calls:
            return "tool_calls"
        if self.mode == "required" and calls and reason == "stop":
            return "tool_calls"
        return reason

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A whole output -> (content, calls)."""
        if self.mode == "auto":
            content, calls = parse_tool_calls(text, self.tools)
            return (content or None) if calls else text, calls
        if self.mode in ("required", "named"):
            calls = parse_forced(text, self.tools)
            return (None, calls) if calls else (text, [])
        return text, []

    def stream(self) -> ChoiceStream:
        return ChoiceStream(self)


def _call_schema(tool: dict) -> dict:
    """One call of `tool` as SGLang's function_call.utils._get_tool_schema writes it."""
    fn = tool["function"]
    return {"properties": {"name": {"type": "string", "enum": [fn["name"]]},
                           "parameters": fn.get("parameters") or {"type": "object",
                                                                  "properties": {}}},
            "required": ["name", "parameters"]}


def _defs(tools: list[dict]) -> dict:
    """The tools' `$defs`, merged (SGLang's _get_tool_schema_defs); a clash is a 400."""
    out: dict = {}
    for tool in tools:
        for name, schema in ((tool["function"].get("parameters") or {}).get("$defs") or {}).items():
            if name in out and out[name] != schema:
                raise APIError(400, f"tools: two tools define $defs {name!r} differently",
                               param="tools")
            out[name] = schema
    return out


def parse_forced(text: str, tools: list[dict]) -> list[ToolCall]:
    """The JSON array a required / named grammar produced -> calls ([] if it is incomplete)."""
    try:
        items = json.loads(text)
    except ValueError:
        return []
    index = {t["function"]["name"]: i for i, t in enumerate(tools)}
    calls = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("name") in index:
            args = json.dumps(item.get("parameters", {}), ensure_ascii=False)
            calls.append(ToolCall(item["name"], args, index[item["name"]]))
    return calls


def openai_calls(calls: list[ToolCall]) -> list[ToolCallOut]:
    return [ToolCallOut(id=call_id(), function={"name": c.name, "arguments": c.arguments})
            for c in calls]


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ChoiceStream:
    """The streamed output of one choice -> (content delta, tool-call deltas) per output delta.
    auto: calls come out whole as each closes (engine.tool_calls.ToolCallStream); required /
    named: the JSON array is held and its calls come out when the choice finishes."""

    def __init__(self, setup: ToolSetup):
        self.setup = setup
        self.parser = ToolCallStream(setup.tools) if setup.mode == "auto" else None
        self.held = ""
        self.num_calls = 0

    def feed(self, text: str, finished: bool) -> tuple[str, list[DeltaToolCall]]:
        mode = self.setup.mode
        if mode == "auto":
            content, calls = self.parser.feed(text)
            if finished:
                content += self.parser.finish()
            return content, self._deltas(calls)
        if mode in ("required", "named"):
            self.held += text
            if not finished:
                return "", []
            calls = parse_forced(self.held, self.setup.tools)
            return ("", self._deltas(calls)) if calls else (self.held, [])
        return text, []

    def _deltas(self, calls: list[ToolCall]) -> list[DeltaToolCall]:
        out = []
        for c in calls:
            out.append(DeltaToolCall(index=self.num_calls, id=call_id(), type="function",
                                     function=DeltaFunction(name=c.name, arguments=c.arguments)))
            self.num_calls += 1
        return out

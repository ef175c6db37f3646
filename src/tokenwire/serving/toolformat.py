"""The default tool format, for chat templates that do not render tools themselves.

Hermes-style (NousResearch's Hermes 2 Pro, Qwen 2.5): the tool definitions go into the system
turn inside `<tools></tools>`, the model answers a call with
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, and a tool's result comes back
in a `tool` turn inside `<tool_response></tool_response>`. All of it is plain text, encoded with
control tokens off like any content: for templates whose tokenizer has no special tokens for
these tags (SmolLM2's ChatML), the tags are ordinary text tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..protocol.tools import Tool, ToolCall
from .template import ChatTemplate

__all__ = ["HERMES", "template_version"]


class HermesFormat:
    name = "hermes"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    _system = (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n{tools}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n"
        "<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n"
        "</tool_call>"
    )

    @property
    def source(self) -> str:
        """What the rendering depends on (hashed into `template_version`)."""
        return f"{self.name}\0{self._system}\0{self.call_text('f', '{}')}\0" \
               f"{self.result_text('r')}"

    def system_text(self, tools: Sequence[Tool]) -> str:
        lines = "\n".join(
            json.dumps(t.model_dump(exclude_none=True), ensure_ascii=False) for t in tools)
        return self._system.format(tools=lines)

    def call_text(self, name: str, arguments: str) -> str:
        """One call as the model writes it; `arguments` verbatim (the JSON text as sampled), so
        a call the model wrote in this form renders back to the same text."""
        head = json.dumps(name, ensure_ascii=False)
        return f'{self.open_tag}\n{{"name": {head}, "arguments": {arguments}}}\n{self.close_tag}'

    def calls_text(self, content: str, calls: Sequence[ToolCall]) -> str:
        """An assistant turn's text: its content, then its calls, one per line."""
        parts = [content] if content else []
        parts += [self.call_text(c.function.name, c.function.arguments) for c in calls]
        return "\n".join(parts)

    result_open = "<tool_response>\n"
    result_close = "\n</tool_response>"

    def result_text(self, content: str) -> str:
        return f"{self.result_open}{content}{self.result_close}"

    @staticmethod
    def template_tools(tools: Sequence[Tool]) -> list[dict[str, Any]]:
        """Tools as a template that renders them reads them (OpenAI's JSON)."""
        return [t.model_dump(exclude_none=True) for t in tools]


HERMES = HermesFormat()


def template_version(template: ChatTemplate) -> str:
    """What renders a prompt, hashed: the template, and the tool format used with it (the
    template's own, or this default)."""
    return template.version("template" if template.renders_tools else HERMES.source)

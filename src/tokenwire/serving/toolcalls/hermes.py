"""Hermes's format (NousResearch's Hermes 2 Pro, Qwen 2.5 and 3, SmolLM3): a call is
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, a tool's result comes back
inside `<tool_response></tool_response>` (vLLM's `hermes` parser).

It is also the default format, for chat templates that do not render tools themselves: the tool
definitions go into the system turn inside `<tools></tools>`. All of it is plain text, encoded
with control tokens off like any content: for templates whose tokenizer has no special tokens for
these tags (SmolLM2's ChatML), the tags are ordinary text tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from ...protocol.tools import Tool
from .format import JSON_NAME, ToolFormat

__all__ = ["HERMES"]

_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n"
    "</tool_call>"
)


@dataclass(frozen=True)
class _Hermes(ToolFormat):
    @property
    def source(self) -> str:
        return f"{self.name}\0{_SYSTEM}\0{self.call_text('f', '{}')}\0{self.result_text('r')}"

    def system_text(self, tools: Sequence[Tool]) -> str:
        lines = "\n".join(
            json.dumps(t.model_dump(exclude_none=True), ensure_ascii=False) for t in tools)
        return _SYSTEM.format(tools=lines)


HERMES = _Hermes(
    name="hermes", sign="<tool_call>", triggers=("<tool_call>",), open_re="",
    head_re=r'<tool_call>\s*\{\s*"name"\s*:\s*' + JSON_NAME + r'\s*,\s*"arguments"\s*:\s*',
    tail_re=r"\s*\}\s*</tool_call>", sep_re=r"\s*", close_re=None,
    begin=lambda name: f'<tool_call>\n{{"name": {json.dumps(name, ensure_ascii=False)}, '
                       '"arguments": ',
    end="}\n</tool_call>", separator="\n", args_end="</tool_call>",
    whole_re=r"<tool_call>\s*(?P<body>\{.*?\})\s*</tool_call>")

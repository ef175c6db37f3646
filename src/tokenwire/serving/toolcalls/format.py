"""A tool-call format: how one family writes calls, as the parser reads them and a grammar forces
them.

Each family's module (hermes.py, llama3.py, mistral.py, deepseek.py) is one `ToolFormat`: a few
regular expressions for the parser (serving/toolcalls/parser.py) and the exact text a grammar
forces under `tool_choice` "required" or a named tool (its `begin`, `end`, `separator` and
`section`, as xgrammar's builtin structural tags spell them for vLLM). Markers that are control
tokens in a family's vocabulary are written as their text here; the embedded engine's grammar
matches them as their ids (engines/grammars/guide.py), and the parser reads them from the text
of the ids, which control tokens keep while tools are parsed (chat turns `skip_special_tokens` off).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import regex

from ...engines.base import Grammar
from ...protocol.tools import Tool, ToolCall
from .._grammars import tagged
from .parser import CallParser, ToolCallParser

__all__ = ["ToolFormat", "call_id", "nine_char_id"]

_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
JSON_NAME = r'"(?P<name>(?:[^"\\]|\\.)*)"'
"""A function name as a JSON string (the group `name`)."""


def call_id() -> str:
    """OpenAI's shape: `call_` and 24 letters and digits."""
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


def nine_char_id() -> str:
    """Mistral's shape: 9 letters and digits (its templates refuse any other)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


def _re(pattern: str | None) -> regex.Pattern[str] | None:
    return regex.compile(pattern, regex.DOTALL) if pattern is not None else None


@dataclass(frozen=True)
class ToolFormat:
    name: str
    """vLLM's name for the parser (`--tool-call-parser`)."""
    sign: str
    """Template text that shows a template writes calls this way."""
    triggers: tuple[str, ...]
    """Text that starts the calls (the parser looks for it; a lazy grammar waits for it)."""
    open_re: str
    """At a trigger: what opens the calls' section (may be empty)."""
    head_re: str
    """A call up to its arguments, the function's name as the group `name`."""
    tail_re: str
    """A call after its arguments."""
    sep_re: str
    """Between two calls."""
    close_re: str | None
    """What closes the section (None: calls end with the turn, or each is closed by its tail)."""
    begin: Callable[[str], str]
    """What a grammar forces before a call's arguments (the name's call)."""
    end: str
    """What a grammar forces after them."""
    separator: str
    section: tuple[str, str] = ("", "")
    args_end: str | None = None
    """A marker that ends a call even if its arguments are unbalanced."""
    json_name: bool = True
    """The name is a JSON string (escapes decoded)."""
    json_wrapped: bool = True
    """A call is a JSON object around its arguments (a stray `}` after them is syntax)."""
    whole_re: str | None = None
    """A call whose head is written another way, whole (the group `body`, one JSON object)."""
    call_id: Callable[[], str] = call_id
    """A new call's id, as the family's templates expect it."""
    extras: Mapping[str, Any] = field(default_factory=dict)

    @cached_property
    def open(self) -> regex.Pattern[str]:
        return _re(self.open_re)

    @cached_property
    def head(self) -> regex.Pattern[str]:
        return _re(self.head_re)

    @cached_property
    def tail(self) -> regex.Pattern[str]:
        return _re(self.tail_re)

    @cached_property
    def sep(self) -> regex.Pattern[str]:
        return _re(self.sep_re)

    @cached_property
    def next_head(self) -> regex.Pattern[str]:
        return _re(f"(?:{self.sep_re})(?:{self.head_re})")

    @cached_property
    def close(self) -> regex.Pattern[str] | None:
        return _re(self.close_re)

    @cached_property
    def whole(self) -> regex.Pattern[str] | None:
        return _re(self.whole_re)

    def whole_call(self, body: str) -> tuple[str, str] | None:
        """(name, arguments) of a call written whole, or None if it is none."""
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return None
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)
                and "arguments" in obj):
            return None
        args = obj["arguments"]
        return obj["name"], args if isinstance(args, str) else json.dumps(args,
                                                                         ensure_ascii=False)

    def parser(self) -> CallParser:
        """A parser of one choice's output in this format."""
        return ToolCallParser(self)

    # -- writing calls (a template that does not write them itself) --------------------------

    @property
    def source(self) -> str:
        """What the rendering depends on (hashed into `template_version`)."""
        return f"{self.name}\0{self.system_text([])}\0{self.calls_text('', [])}"

    def call_text(self, name: str, arguments: str) -> str:
        """One call as the model writes it; `arguments` verbatim (the JSON text as sampled), so
        a call the model wrote in this form renders back to the same text."""
        return f"{self.begin(name)}{arguments}{self.end}"

    def calls_text(self, content: str, calls: Sequence[ToolCall]) -> str:
        """An assistant turn's text: its content, then its calls."""
        body = self.separator.join(self.call_text(c.function.name, c.function.arguments)
                                   for c in calls)
        text = f"{self.section[0]}{body}{self.section[1]}" if calls else ""
        return "\n".join(p for p in (content, text) if p)

    result_open = "<tool_response>\n"
    result_close = "\n</tool_response>"

    def result_text(self, content: str) -> str:
        return f"{self.result_open}{content}{self.result_close}"

    def system_text(self, tools: Sequence[Tool]) -> str:
        """The tools for a template that does not render them: their definitions, and how to
        call them in this format."""
        lines = "\n".join(
            json.dumps(t.model_dump(exclude_none=True), ensure_ascii=False) for t in tools)
        example = self.calls_text("", [_EXAMPLE])
        return ("# Tools\n\nYou may call one or more functions to assist with the user query."
                "\n\nYou are provided with function signatures within <tools></tools> XML tags:"
                f"\n<tools>\n{lines}\n</tools>\n\nTo call a function, write:\n{example}")

    @staticmethod
    def template_tools(tools: Sequence[Tool]) -> list[dict[str, Any]]:
        """Tools as a template that renders them reads them (OpenAI's JSON)."""
        return [t.model_dump(exclude_none=True) for t in tools]

    # -- the grammar -------------------------------------------------------------------------

    def grammar(self, tools: Sequence[tuple[str, Mapping[str, Any] | None, str]], *,
                parallel: bool, lazy: bool) -> Grammar | None:
        """One or more (`parallel`) calls of the named tools in this format; `lazy`: free text
        until a trigger (tool_choice "auto"). Each tool: (name, its parameters schema, the
        param path of that schema)."""
        tags = [(self.begin(name), s if s is not None else {"type": "object"}, at, self.end)
                for name, s, at in tools]
        triggers: tuple[str, ...] = ()
        if lazy:
            lead = self.section[0] or self.begin(tools[0][0])
            triggers = tuple(t for t in self.triggers if lead.startswith(t))[:1]
        return tagged(tags, parallel=parallel, param="tools", triggers=triggers,
                      separator=self.separator, section=self.section)


_EXAMPLE = ToolCall.model_validate({"id": "call_0", "type": "function", "function": {
    "name": "<function-name>", "arguments": "<args-json-object>"}})

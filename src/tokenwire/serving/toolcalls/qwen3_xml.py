"""Qwen3-Coder's and Qwen 3.5's XML calls (vLLM's `qwen3_coder` / `qwen3_xml` parser; Nemotron 3
Nano's and Step 3.5's templates write the same shape):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A call's `arguments` are made, not sampled: a JSON object of each parameter's text, one leading
and one trailing newline trimmed (the template's markup), every value a string, as vLLM 0.32's
`_qwen3_arg_converter` makes them (vllm/parser/qwen3.py). The ids stay exact as ever: each
update's ids are those of the text it classifies. Under `tool_choice` "required" or a named tool
the calls are a GBNF grammar over the tools' parameter names (required ones in schema order,
optional ones may follow); a value there is one of its `enum`, or text without `<`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import regex

from ...engines.base import Grammar
from .format import ToolFormat, call_id
from .parser import ParsedDelta, ParserBase

__all__ = ["QWEN3_XML", "XmlCallParser"]

_PARAMS, _VALUE = range(2, 4)
_CALL_RE = regex.compile(r"<tool_call>\s*<function=(?P<name>[^>\n]+)>\s*")
_PARAM_RE = regex.compile(r"<parameter=(?P<name>[^>\n]+)>\n?")
_FUNC_END_RE = regex.compile(r"</function>\s*</tool_call>")
_PARAM_END = "</parameter>"


class XmlCallParser(ParserBase):
    """The shared parser (push, finish, calls; text, triggers and ids in `ParserBase`) with the
    XML shape's own steps: a call's head, its parameters, each value."""

    def __init__(self, fmt: ToolFormat):
        super().__init__(fmt)
        self._first_param = True

    def _steps(self) -> dict[int, Callable[[ParsedDelta], None]]:
        return {**super()._steps(), _PARAMS: self._params, _VALUE: self._value}

    def _cut_short(self, out: ParsedDelta, buf: str) -> None:
        if self._state == _VALUE:  # cut short: the value as far as it got
            self._args(out, json.dumps(buf.removesuffix("\n"), ensure_ascii=False)[1:-1]
                       + '"}')
        elif self._state == _PARAMS:  # cut short between parameters
            self._args(out, "}")

    def _open(self, out: ParsedDelta) -> None:
        m = _CALL_RE.match(self._buf, partial=True)
        if m is not None and m.partial:
            return
        if m is None:  # not a call: the tag is the model's text
            self._not_a_call(out)
            return
        self._call(out, m.group("name").strip())
        self._first_param = True
        self._buf, self._state = self._buf[m.end():], _PARAMS
        self._args(out, "{")

    def _params(self, out: ParsedDelta) -> None:
        self._buf = self._buf.lstrip()  # whitespace between parameters: markup
        if not self._buf:
            return
        m = _PARAM_RE.match(self._buf, partial=True)
        if m is not None and not m.partial and m.end() == len(self._buf) \
                and not m.group(0).endswith("\n"):
            return  # the markup's newline may come next
        if m is not None and not m.partial:
            key = json.dumps(m.group("name").strip(), ensure_ascii=False)
            self._args(out, ("" if self._first_param else ", ") + f'{key}: "')
            self._first_param = False
            self._buf, self._state = self._buf[m.end():], _VALUE
            return
        e = _FUNC_END_RE.match(self._buf, partial=True)
        if e is not None and not e.partial:
            self._args(out, "}")
            self._buf = self._buf[e.end():]
            self._calls_end()
            return
        if m is not None or e is not None:
            return  # either may still complete
        # anything else inside a call: the call ends there, the rest is the model's text
        self._args(out, "}")
        self._calls_end()

    def _value(self, out: ParsedDelta) -> None:
        buf = self._buf
        at = buf.find(_PARAM_END)
        if at >= 0:
            self._args(out, json.dumps(buf[:at].removesuffix("\n"), ensure_ascii=False)[1:-1]
                       + '"')
            self._buf, self._state = buf[at + len(_PARAM_END):].lstrip(), _PARAMS
            return
        # hold what may start the end tag, and a newline that may be the markup's
        keep = next((n for n in range(min(len(buf), len(_PARAM_END) - 1), 0, -1)
                     if _PARAM_END.startswith(buf[-n:])), 0)
        body = buf[:len(buf) - keep]
        if body.endswith("\n"):
            body = body[:-1]
        if body:
            self._args(out, json.dumps(body, ensure_ascii=False)[1:-1])
            self._buf = buf[len(body):]


def _gbnf_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


@dataclass(frozen=True)
class _Qwen3Xml(ToolFormat):
    def parser(self) -> XmlCallParser:
        return XmlCallParser(self)

    def call_text(self, name: str, arguments: str) -> str:
        try:
            args = json.loads(arguments)
        except json.JSONDecodeError:
            args = {}
        if not isinstance(args, dict):
            args = {}
        params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n"
                         "</parameter>\n" for k, v in (args or {}).items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"

    def grammar(self, tools: Sequence[tuple[str, Mapping[str, Any] | None, str]], *,
                parallel: bool, lazy: bool) -> Grammar | None:
        """The calls as GBNF: each tool's parameters by name (its required ones in schema
        order, then its optional ones, each optional), values text without `<`. Lazy ("auto"):
        None, the calls are parsed, not enforced (a GBNF grammar has no trigger here)."""
        if lazy:
            return None
        rules, calls = [], []
        for k, (name, schema, _) in enumerate(tools):
            schema = schema if isinstance(schema, dict) else {}
            found = schema.get("properties")
            properties = found if isinstance(found, dict) else {}
            props = list(properties)
            listed = schema.get("required")
            required = [p for p in (listed if isinstance(listed, list) else []) if p in props]
            optional = [p for p in props if p not in required]
            parts = [f"param-{k}-{j}" + ("" if p in required else "?")
                     for j, p in enumerate(required + optional)]
            for j, p in enumerate(required + optional):
                sub = properties[p]
                enum = sub.get("enum") if isinstance(sub, dict) else None
                value = " | ".join(_gbnf_literal(str(v)) for v in enum) \
                    if isinstance(enum, list) and enum else "value"
                rules.append(f"param-{k}-{j} ::= {_gbnf_literal(f'<parameter={p}>' + chr(10))} "
                             f"({value}) {_gbnf_literal(chr(10) + '</parameter>' + chr(10))}")
            head = _gbnf_literal(f"<tool_call>\n<function={name}>\n")
            tail = _gbnf_literal("</function>\n</tool_call>")
            rules.append(f"call-{k} ::= {head} {' '.join(parts)} {tail}")
            calls.append(f"call-{k}")
        more = ' ("\\n" call)*' if parallel else ""
        text = "\n".join([f"root ::= call{more}", f"call ::= {' | '.join(calls)}",
                          "value ::= [^<]*", *rules])
        return Grammar(gbnf=text, param="tools")


QWEN3_XML = _Qwen3Xml(
    name="qwen3_coder", sign="<function=", triggers=("<tool_call>",), open_re="", head_re="",
    tail_re="", sep_re="", close_re=None, begin=lambda name: "", end="", separator="\n",
    call_id=call_id)

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
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import regex

from ...engines.base import Grammar, TokenEvent
from ..output import Delta
from .format import ToolFormat, call_id
from .parser import CallPiece, ParsedCall, ParsedDelta

__all__ = ["QWEN3_XML", "XmlCallParser"]

_TEXT, _CALL, _PARAMS, _VALUE = range(4)
_CALL_RE = regex.compile(r"<tool_call>\s*<function=(?P<name>[^>\n]+)>\s*")
_PARAM_RE = regex.compile(r"<parameter=(?P<name>[^>\n]+)>\n?")
_FUNC_END_RE = regex.compile(r"</function>\s*</tool_call>")
_PARAM_END = "</parameter>"


class XmlCallParser:
    """The same interface as `ToolCallParser` (push, finish, calls) for the XML shape."""

    def __init__(self, fmt: ToolFormat):
        self._f = fmt
        self._state = _TEXT
        self._buf = ""
        self._held = ""  # a call's syntax so far, content again if no call follows
        self._seen = 0
        self._pending: deque[tuple[int, list[int], list[TokenEvent]]] = deque()
        self.calls: list[ParsedCall] = []
        self._first_param = True
        self._after_call = False
        self._last_call = False

    def push(self, delta: Delta, *, last: bool = False) -> ParsedDelta:
        self._buf += delta.text
        self._seen += len(delta.text)
        if delta.ids:
            self._pending.append((self._seen, list(delta.ids), list(delta.events)))
        out = ParsedDelta()
        self._drain(out)
        out = self._with_ids(out)
        if last:
            tail = self.finish()
            out = ParsedDelta(out.content + tail.content, out.calls + tail.calls,
                              out.ids + tail.ids, out.events + tail.events)
        return out

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        buf, self._buf = self._buf, ""
        if self._state == _TEXT:
            if buf and not (self._after_call or (self._last_call and not buf.strip())):
                self._content(out, buf)
        elif self._state == _CALL:
            self._content(out, self._held + buf)  # a tag with no call after it: text
        elif self._state == _VALUE:  # cut short: the value as far as it got
            self._piece(out, json.dumps(buf.removesuffix("\n"), ensure_ascii=False)[1:-1]
                        + '"}')
        elif self._state == _PARAMS:  # cut short between parameters
            self._piece(out, "}")
        self._state, self._held = _TEXT, ""
        return self._with_ids(out)

    # -- internals ----------------------------------------------------------------------------

    def _with_ids(self, out: ParsedDelta) -> ParsedDelta:
        released = self._seen - len(self._buf) - len(self._held)
        while self._pending and self._pending[0][0] <= released:
            _, ids, events = self._pending.popleft()
            out.ids += ids
            out.events += events
        return out

    def _content(self, out: ParsedDelta, text: str) -> None:
        if text:
            out.content += text
            self._last_call = False

    def _piece(self, out: ParsedDelta, text: str) -> None:
        if text:
            self.calls[-1].arguments += text
            out.calls.append(CallPiece(len(self.calls) - 1, arguments=text))

    def _drain(self, out: ParsedDelta) -> None:
        step = {_TEXT: self._text, _CALL: self._call, _PARAMS: self._params,
                _VALUE: self._value}
        while self._buf:
            before = (self._state, len(self._buf))
            step[self._state](out)
            if (self._state, len(self._buf)) == before:
                return

    def _text(self, out: ParsedDelta) -> None:
        buf = self._buf
        if self._after_call:
            stripped = buf.lstrip()
            if not stripped:
                self._buf = ""
                return
            self._buf = buf = stripped
            self._after_call = False
        at = buf.find("<tool_call>")
        if at >= 0:
            core = buf[:at].rstrip()
            self._content(out, core)
            self._held, self._buf, self._state = buf[len(core):at], buf[at:], _CALL
            return
        keep = next((n for n in range(min(len(buf), 10), 0, -1)
                     if "<tool_call>".startswith(buf[-n:])), 0)
        free = buf[:len(buf) - keep].rstrip()
        if free:
            self._content(out, free)
            self._buf = buf[len(free):]

    def _call(self, out: ParsedDelta) -> None:
        m = _CALL_RE.match(self._buf, partial=True)
        if m is not None and m.partial:
            return
        if m is None:  # not a call: the tag is the model's text
            self._content(out, self._held + "<tool_call>")
            self._held, self._buf, self._state = "", self._buf[len("<tool_call>"):], _TEXT
            return
        call = ParsedCall(self._f.call_id(), m.group("name").strip())
        self.calls.append(call)
        out.calls.append(CallPiece(len(self.calls) - 1, id=call.id, name=call.name))
        self._held, self._last_call, self._first_param = "", True, True
        self._buf, self._state = self._buf[m.end():], _PARAMS
        self._piece(out, "{")

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
            self._piece(out, ("" if self._first_param else ", ") + f'{key}: "')
            self._first_param = False
            self._buf, self._state = self._buf[m.end():], _VALUE
            return
        e = _FUNC_END_RE.match(self._buf, partial=True)
        if e is not None and not e.partial:
            self._piece(out, "}")
            self._buf, self._state, self._after_call = self._buf[e.end():], _TEXT, True
            return
        if m is not None or e is not None:
            return  # either may still complete
        # anything else inside a call: the call ends there, the rest is the model's text
        self._piece(out, "}")
        self._state, self._after_call = _TEXT, True

    def _value(self, out: ParsedDelta) -> None:
        buf = self._buf
        at = buf.find(_PARAM_END)
        if at >= 0:
            self._piece(out, json.dumps(buf[:at].removesuffix("\n"), ensure_ascii=False)[1:-1]
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
            self._piece(out, json.dumps(body, ensure_ascii=False)[1:-1])
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

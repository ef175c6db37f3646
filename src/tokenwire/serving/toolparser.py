"""Tool calls out of sampled text, incrementally, without touching the ids.

One state machine serves streams and whole responses (a whole response is one push), so both
classify the same text the same way. The text is split into content, call pieces (a call's
name, then its `arguments` JSON text exactly as sampled, in pieces) and the format's syntax
(tags, the `{"name": ...` head, whitespace around calls). Each sampled token's ids go out with
the update that classifies the last of its text, so every update's ids are the ids of exactly
what it carries (content, arguments or syntax) and their concatenation is the sampled ids.

Text that only looks like a call (a tag with no well-formed call after it) is content, as the
model wrote it: nothing is dropped or repaired.
"""

from __future__ import annotations

import json
import re
import secrets
from collections import deque
from dataclasses import dataclass, field

from ..engines.base import TokenEvent
from .output import Delta

__all__ = ["CallPiece", "ParsedCall", "ParsedDelta", "ToolCallParser"]

_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def call_id() -> str:
    """OpenAI's shape: `call_` and 24 letters and digits."""
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


@dataclass
class CallPiece:
    index: int
    id: str | None = None
    name: str | None = None
    """With `id`: the first piece of a call."""
    arguments: str = ""


@dataclass
class ParsedCall:
    id: str
    name: str
    arguments: str = ""


@dataclass
class ParsedDelta:
    content: str = ""
    calls: list[CallPiece] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    events: list[TokenEvent] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.calls or self.ids)


_TEXT, _HEAD, _ARGS, _TAIL = range(4)


class ToolCallParser:
    def __init__(self, open_tag: str, close_tag: str):
        self._open = open_tag
        self._close = close_tag
        self._head = re.compile(re.escape(open_tag) + r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"'
                                r'\s*,\s*"arguments"\s*:\s*')
        self._state = _TEXT
        self._buf = ""  # text not classified yet
        self._seen = 0  # characters pushed so far
        self._pending: deque[tuple[int, list[int], list[TokenEvent]]] = deque()
        self.calls: list[ParsedCall] = []
        self._after_call = False  # whitespace right after a call is syntax
        self._ws = ""  # whitespace before a tag, until it is known to open a call
        self._last_call = False  # the last thing classified was a call (not content)
        # JSON scanning state of the arguments value
        self._depth = 0
        self._in_str = False
        self._esc = False
        self._started = False
        self._nested = False

    # -- the interface ------------------------------------------------------------------------

    def push(self, delta: Delta, *, last: bool = False) -> ParsedDelta:
        """Classify a delta's text; `last`: nothing follows it (`finish` included)."""
        self._buf += delta.text
        self._seen += len(delta.text)
        if delta.ids:
            self._pending.append((self._seen, list(delta.ids), list(delta.events)))
        out = ParsedDelta()
        self._drain(out, final=False)
        out = self._with_ids(out)
        if last:
            tail = self.finish()
            out = ParsedDelta(out.content + tail.content, out.calls + tail.calls,
                              out.ids + tail.ids, out.events + tail.events)
        return out

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        self._drain(out, final=True)
        if self._state == _TAIL:  # no closing tag: what follows the arguments is read as text
            self._state, self._buf = _TEXT, self._tail_text(self._buf)
            self._after_call = True
            self._drain(out, final=True)
        buf, self._buf = self._buf, ""
        if self._state == _TEXT:
            if buf and not (self._after_call or (self._last_call and not buf.strip())):
                out.content += buf
        elif self._state == _HEAD:
            out.content += self._ws + buf  # a tag with no call after it: the model's text
        elif self._state == _ARGS:
            self._args(out, buf)  # cut short (length): the arguments as far as they got
        self._state, self._ws = _TEXT, ""
        return self._with_ids(out)

    # -- internals ----------------------------------------------------------------------------

    def _with_ids(self, out: ParsedDelta) -> ParsedDelta:
        released = self._seen - len(self._buf) - len(self._ws)
        while self._pending and self._pending[0][0] <= released:
            _, ids, events = self._pending.popleft()
            out.ids += ids
            out.events += events
        return out

    def _content(self, out: ParsedDelta, text: str) -> None:
        if text:
            out.content += text
            self._last_call = False

    def _args(self, out: ParsedDelta, text: str) -> None:
        if text:
            self.calls[-1].arguments += text
            out.calls.append(CallPiece(len(self.calls) - 1, arguments=text))

    def _drain(self, out: ParsedDelta, *, final: bool) -> None:
        while self._buf:
            before = (self._state, len(self._buf))
            if self._state == _TEXT:
                self._text(out, final)
            elif self._state == _HEAD:
                self._head_step(out)
            elif self._state == _ARGS:
                self._args_step(out)
            else:
                self._tail_step(out)
            if (self._state, len(self._buf)) == before:
                return  # waiting for more text

    def _text(self, out: ParsedDelta, final: bool) -> None:
        buf = self._buf
        if self._after_call:
            stripped = buf.lstrip()
            if not stripped:
                self._buf = ""  # whitespace after a call: syntax
                return
            self._buf = buf = stripped
            self._after_call = False
        at = buf.find(self._open)
        if at >= 0:
            text = buf[:at]
            core = text.rstrip()
            self._content(out, core)
            self._ws = text[len(core):]  # syntax before a call; content if none follows
            self._buf = buf[at:]
            self._state = _HEAD
            return
        # hold back what may still become a tag, and trailing whitespace (it may precede one)
        keep = 0
        for n in range(min(len(buf), len(self._open) - 1), 0, -1):
            if self._open.startswith(buf[-n:]):
                keep = n
                break
        body = buf[:len(buf) - keep]
        free = body.rstrip()
        if free:
            self._content(out, free)
            self._buf = buf[len(free):]

    def _head_step(self, out: ParsedDelta) -> None:
        after = self._buf[len(self._open):].lstrip()
        if after and after[0] != "{":  # not a call: the tag is the model's text
            self._content(out, self._ws + self._open)
            self._ws = ""
            self._buf = self._buf[len(self._open):]
            self._state = _TEXT
            return
        m = self._head.match(self._buf)
        if m is not None:
            try:
                name = json.loads(f'"{m.group(1)}"')
            except json.JSONDecodeError:
                name = m.group(1)
            call = ParsedCall(call_id(), name)
            self.calls.append(call)
            out.calls.append(CallPiece(len(self.calls) - 1, id=call.id, name=name))
            self._buf = self._buf[m.end():]
            self._ws = ""
            self._state = _ARGS
            self._depth, self._in_str, self._esc, self._started = 0, False, False, False
            return
        end = self._buf.find(self._close)
        if end < 0:
            return  # wait: the head may still complete
        # a call written some other way ({"arguments": ..., "name": ...}): parse it whole
        body = self._buf[len(self._open):end]
        whole = self._buf[:end + len(self._close)]
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("name"), str) and "arguments" in obj:
            args = obj["arguments"]
            text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            call = ParsedCall(call_id(), obj["name"], text)
            self.calls.append(call)
            out.calls.append(CallPiece(len(self.calls) - 1, id=call.id, name=call.name,
                                       arguments=text))
            self._after_call = self._last_call = True
        else:
            self._content(out, self._ws + whole)
        self._ws = ""
        self._buf = self._buf[len(whole):]
        self._state = _TEXT

    def _args_step(self, out: ParsedDelta) -> None:
        """The arguments value, as sampled: an object or array up to its closing bracket, a
        bare value (a JSON string, a number) up to the `,` or `}` that ends it."""
        buf = self._buf
        i = 0
        if not self._started:
            stripped = buf.lstrip()
            i = len(buf) - len(stripped)  # whitespace before the value: syntax
            if not stripped:
                self._buf = ""
                return
            self._started = True
            self._nested = stripped[0] in "{["
        start = i
        done = False
        while i < len(buf) and not done:
            c = buf[i]
            if not self._in_str and buf.startswith(self._close, i):
                break  # unbalanced arguments: the closing tag ends them
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif c == "\\":
                    self._esc = True
                elif c == '"':
                    self._in_str = False
            elif c == '"':
                self._in_str = True
            elif not self._nested and c in ",}":
                break  # ends a bare value; not part of it
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                done = self._depth == 0
            i += 1
        if i == len(buf) and not done and not self._in_str:
            # hold what may be the start of the closing tag
            for n in range(min(len(buf) - start, len(self._close) - 1), 0, -1):
                if self._close.startswith(buf[len(buf) - n:]):
                    i -= n
                    break
        self._args(out, buf[start:i])
        self._buf = buf[i:]
        if done or len(self._buf) >= len(self._close) or (
                self._buf and not self._close.startswith(self._buf)):
            self._state = _TAIL

    def _tail_text(self, text: str) -> str:
        """What follows a call's arguments, less the format's own `}` and whitespace."""
        rest = text.lstrip()
        return rest[1:].strip() if rest.startswith("}") else rest.strip()

    def _tail_step(self, out: ParsedDelta) -> None:
        end = self._buf.find(self._close)
        if end < 0:
            return
        # anything but the format's syntax between the arguments and the tag: the model's text
        self._content(out, self._tail_text(self._buf[:end]))
        self._buf = self._buf[end + len(self._close):]
        self._state = _TEXT
        self._after_call = self._last_call = True

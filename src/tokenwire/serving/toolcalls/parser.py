"""Tool calls out of sampled text, incrementally, without touching the ids.

One state machine serves every format (`ParserBase`: the text, the triggers, the ids; a format
adds the steps of its own states: `ToolCallParser`'s, for the formats that are a handful of
regular expressions, serving/toolcalls/; qwen3_xml.py's, for calls written as XML) and both
streams and whole responses (a whole response is one push), so both classify the same text the
same way. The text is split into content, call pieces (a call's
name, then its arguments JSON text exactly as sampled, in pieces) and the format's syntax
(markers, the head that names the function, separators, whitespace around calls). Each sampled
token's ids go out with the update that classifies the last of its text, so every update's ids are
the ids of exactly what it carries (content, arguments or syntax) and their concatenation is the
sampled ids.

The expressions are matched with `regex`'s partial matching: text that may still become syntax
waits for the next token, text that cannot is released at once. Text that only looks like a call
(a marker with no well-formed call after it) is content, as the model wrote it: nothing is
dropped or repaired.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...engines.base import TokenEvent
from ..output import Delta

__all__ = ["CallParser", "CallPiece", "CallSyntax", "ParsedCall", "ParsedDelta", "ParserBase",
           "ToolCallParser"]


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


class CallParser(Protocol):
    """What chat, Responses and Messages read of a format's parser."""

    calls: list[ParsedCall]

    def push(self, delta: Delta, *, last: bool = False) -> ParsedDelta: ...

    def finish(self) -> ParsedDelta: ...


class CallSyntax(Protocol):
    """What the parser reads of a format (format.py's `ToolFormat`, which makes its parser):
    named here so that neither module imports the other's."""

    @property
    def triggers(self) -> tuple[str, ...]: ...
    @property
    def open(self) -> Any: ...  # each pattern a `regex.Pattern[str]`
    @property
    def head(self) -> Any: ...
    @property
    def tail(self) -> Any: ...
    @property
    def sep(self) -> Any: ...
    @property
    def next_head(self) -> Any: ...
    @property
    def close(self) -> Any | None: ...
    @property
    def whole(self) -> Any | None: ...
    @property
    def args_end(self) -> str | None: ...
    @property
    def json_name(self) -> bool: ...
    @property
    def json_wrapped(self) -> bool: ...
    @property
    def call_id(self) -> Callable[[], str]: ...
    def whole_call(self, body: str) -> tuple[str, str] | None: ...


_TEXT, _OPEN = 0, 1
"""The states every format's parser has: text, and a trigger that may open a call; each
format's own states follow (from 2 on)."""


class ParserBase:
    """The plumbing every format's parser shares: text pushed, classified by the format's state
    machine (`_steps`, one step per state, run until none makes progress), each token's ids
    released with the update that classifies the last of its text; content and the triggers
    that may open a call; the end of the text."""

    def __init__(self, fmt: CallSyntax):
        self._f = fmt
        self._state = _TEXT
        self._buf = ""  # text not classified yet
        self._held = ""  # classified as syntax, unless what follows shows it to be content
        self._trigger = ""  # the trigger `_held` holds, after `_lead` characters of whitespace
        self._lead = 0
        self._seen = 0  # characters pushed so far
        self._pending: deque[tuple[int, list[int], list[TokenEvent]]] = deque()
        self.calls: list[ParsedCall] = []
        self._after_call = False  # whitespace right after a call is syntax
        self._last_call = False  # the last thing classified was a call (not content)

    # -- the interface ------------------------------------------------------------------------

    def push(self, delta: Delta, *, last: bool = False) -> ParsedDelta:
        """Classify a delta's text; `last`: nothing follows it (`finish` included)."""
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
        self._drain(out)
        self._settle(out)
        buf, self._buf = self._buf, ""
        if self._state == _TEXT:
            if buf and not (self._after_call or (self._last_call and not buf.strip())):
                self._content(out, buf)
        elif self._state == _OPEN:
            self._content(out, self._held + buf)  # a marker with no call after it: text
        else:
            self._cut_short(out, buf)
        self._state, self._held = _TEXT, ""
        return self._with_ids(out)

    # -- what a format's parser gives ---------------------------------------------------------

    def _steps(self) -> dict[int, Callable[[ParsedDelta], None]]:
        """The step of each state: a format's parser adds those of its own states."""
        return {_TEXT: self._text, _OPEN: self._open}

    def _open(self, out: ParsedDelta) -> None:
        """After a trigger: a call's opening, or `_not_a_call`."""
        raise NotImplementedError

    def _settle(self, out: ParsedDelta) -> None:
        """At the end of the text, before what is left is classified."""

    def _cut_short(self, out: ParsedDelta, buf: str) -> None:
        """The text ended in a state of the format's own (from 2 on), `buf` left."""
        raise NotImplementedError

    # -- the plumbing -------------------------------------------------------------------------

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

    def _args(self, out: ParsedDelta, text: str) -> None:
        if text:
            self.calls[-1].arguments += text
            out.calls.append(CallPiece(len(self.calls) - 1, arguments=text))

    def _call(self, out: ParsedDelta, name: str, arguments: str = "") -> None:
        call = ParsedCall(self._f.call_id(), name, arguments)
        self.calls.append(call)
        out.calls.append(CallPiece(len(self.calls) - 1, id=call.id, name=name,
                                   arguments=arguments))
        self._held, self._last_call = "", True

    def _drain(self, out: ParsedDelta) -> None:
        step = self._steps()
        while self._buf:
            before = (self._state, len(self._buf))
            step[self._state](out)
            if (self._state, len(self._buf)) == before:
                return  # waiting for more text

    def _calls_end(self) -> None:
        """What follows is text (whitespace first: syntax)."""
        self._state, self._after_call = _TEXT, True

    def _not_a_call(self, out: ParsedDelta) -> None:
        """The trigger opened no call: it is the model's text; look on after it."""
        text = self._held + self._buf
        end = self._lead + len(self._trigger)
        self._held = ""
        self._content(out, text[:end])
        self._buf = text[end:]
        self._state = _TEXT

    def _text(self, out: ParsedDelta) -> None:
        buf = self._buf
        if self._after_call:
            stripped = buf.lstrip()
            if not stripped:
                self._buf = ""  # whitespace after a call: syntax
                return
            self._buf = buf = stripped
            self._after_call = False
        found = [(buf.find(t), t) for t in self._f.triggers if t in buf]
        if found:
            at, word = min(found, key=lambda f: (f[0], -len(f[1])))
            core = buf[:at].rstrip()
            self._content(out, core)
            self._held = buf[len(core):at]  # syntax before a call; content if none follows
            self._lead = len(self._held)
            self._trigger, self._buf, self._state = word, buf[at:], _OPEN
            return
        # hold back what may still become a trigger, and trailing whitespace (it may precede one)
        keep = 0
        for word in self._f.triggers:
            for n in range(min(len(buf), len(word) - 1), keep, -1):
                if word.startswith(buf[-n:]):
                    keep = n
                    break
        body = buf[:len(buf) - keep]
        free = body.rstrip()
        if free:
            self._content(out, free)
            self._buf = buf[len(free):]


_HEAD, _ARGS, _TAIL, _AFTER = range(2, 6)


class ToolCallParser(ParserBase):
    """The formats whose calls are a head that names the function and its arguments as
    sampled (JSON), between markers: Hermes, Mistral, DeepSeek, Llama 3's JSON."""

    def __init__(self, fmt: CallSyntax):
        super().__init__(fmt)
        # JSON scanning state of the arguments value
        self._depth = 0
        self._in_str = False
        self._esc = False
        self._started = False
        self._nested = False

    def _steps(self) -> dict[int, Callable[[ParsedDelta], None]]:
        return {**super()._steps(), _HEAD: self._head, _ARGS: self._args_step,
                _TAIL: self._tail, _AFTER: self._after}

    def _settle(self, out: ParsedDelta) -> None:
        if self._state == _TAIL:  # no end of the call: what follows the arguments is text
            self._state, self._buf = _TEXT, self._tail_text(self._buf)
            self._after_call = True
            self._drain(out)

    def _cut_short(self, out: ParsedDelta, buf: str) -> None:
        if self._state == _HEAD:
            self._content(out, self._held + buf)  # a marker with no call after it: text
        elif self._state == _ARGS:
            self._args(out, buf)  # cut short (length): the arguments as far as they got
        elif self._state == _AFTER:  # after a call: a separator is syntax, the rest text
            sep = self._f.sep.match(buf)
            rest = buf[sep.end():] if sep is not None else buf
            if rest.strip() and not (self._f.close is not None
                                     and self._f.close.fullmatch(rest, partial=True)):
                self._content(out, rest.strip())

    def _open(self, out: ParsedDelta) -> None:
        m = self._f.open.match(self._buf, partial=True)
        if m is None:
            self._not_a_call(out)
        elif not m.partial:
            self._held += self._buf[:m.end()]
            self._buf = self._buf[m.end():]
            self._state = _HEAD

    def _head(self, out: ParsedDelta) -> None:
        m = self._f.head.match(self._buf, partial=True)
        if m is not None and not m.partial:
            self._buf = self._buf[m.end():]
            self._start_args(out, m.group("name"))
            return
        if m is not None:
            return  # the head may still complete
        whole = self._f.whole.match(self._buf, partial=True) if self._f.whole else None
        if whole is not None and whole.partial:
            return
        call = self._f.whole_call(whole.group("body")) if whole is not None else None
        if call is None:
            self._not_a_call(out)
            return
        self._buf = self._buf[whole.end():]  # type: ignore[union-attr]
        self._call(out, *call)
        self._state, self._after_call = _AFTER, True

    def _start_args(self, out: ParsedDelta, name: str) -> None:
        try:
            name = json.loads(f'"{name}"') if self._f.json_name else name
        except json.JSONDecodeError:
            pass
        self._call(out, name)
        self._state = _ARGS
        self._depth, self._in_str, self._esc, self._started = 0, False, False, False

    def _args_step(self, out: ParsedDelta) -> None:
        """The arguments value, as sampled: an object or array up to its closing bracket, a
        bare value (a JSON string, a number) up to the `,` or `}` that ends it."""
        buf = self._buf
        end_mark = self._f.args_end
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
            if not self._in_str and end_mark and buf.startswith(end_mark, i):
                break  # unbalanced arguments: the call's end marker ends them
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
        if i == len(buf) and not done and not self._in_str and end_mark:
            # hold what may be the start of the end marker
            for n in range(min(len(buf) - start, len(end_mark) - 1), 0, -1):
                if end_mark.startswith(buf[len(buf) - n:]):
                    i -= n
                    break
        self._args(out, buf[start:i])
        self._buf = buf[i:]
        if done or (self._buf and not (end_mark and end_mark.startswith(self._buf))) \
                or (end_mark and len(self._buf) >= len(end_mark)):
            self._state = _TAIL

    def _tail_text(self, text: str) -> str:
        """What follows a call's arguments, less the format's own `}` and whitespace."""
        rest = text.lstrip()
        return rest[1:].strip() if rest.startswith("}") and self._f.json_wrapped \
            else rest.strip()

    def _tail(self, out: ParsedDelta) -> None:
        m = self._f.tail.match(self._buf, partial=True)
        if m is not None and not m.partial:
            self._buf = self._buf[m.end():]
            self._state = _AFTER
            return
        if m is not None:
            return
        # anything but the format's syntax between the arguments and the call's end: text
        end_mark = self._f.args_end
        end = self._buf.find(end_mark) if end_mark else -1
        if end_mark and end < 0:
            return
        if end < 0:
            self._content(out, self._tail_text(self._buf))
            self._buf = ""
            self._calls_end()
            return
        self._content(out, self._tail_text(self._buf[:end]))
        self._buf = self._buf[end + len(end_mark or ""):]
        self._state = _AFTER
        self._last_call = True

    def _after(self, out: ParsedDelta) -> None:
        """Between calls: another call, the end of the calls, or text."""
        m = self._f.next_head.match(self._buf, partial=True)
        if m is not None and not m.partial:
            self._buf = self._buf[m.end():]
            self._start_args(out, m.group("name"))
            return
        c = self._f.close.match(self._buf, partial=True) if self._f.close else None
        if c is not None and not c.partial:
            self._buf = self._buf[c.end():]
            self._calls_end()
            return
        if (m is not None or c is not None) and self._buf.strip():
            return  # may still be either
        if not self._buf.strip():
            if self._f.close is None:
                self._buf = ""  # whitespace after a call: syntax
            return
        self._calls_end()

"""From sampled ids to deltas: stop strings and UTF-8 boundaries, shared by every endpoint.

Two hold-backs, in this order:
- stop strings (token-granular): a token whose bytes could begin a stop string waits until the
  string is ruled out or matched. On a match, the ids end with the last token that lies wholly
  before the stop string. The text ends exactly before the stop string, as OpenAI's does; but
  when the request shows ids (`token_aligned`), the text is the text of those ids, so the two
  always agree (a stop string that begins inside a token then drops that token; docs/api/chat.md).
- UTF-8 (byte-granular): bytes of an incomplete character are held until it completes, so a
  delta's text never splits a character; its ids go out at once (the text may be "").

Invariant: concat(delta.text) == decode(concat(delta.ids)) with errors="replace".

TGI's stop rule (`stop_at_end`, serving/tgi.py): a stop string ends the output only where the
output so far ends with it, at a token's end; a token that completes it and goes on (`" tested"`
for `"test"`) does not stop it, and the token that completes it is the last id.

A request that shows only ids (`response_format_tokens: "only"`, /inference/v1/generate) reads
no text: built with `text=None`, the decoder looks no token's bytes up unless stop strings must
be matched, and its deltas' text stays "". Each choice that is made text (or bytes, for stop
strings) counts one decode conversion (tokenizers/conversions.py), however many deltas it has.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..engines.base import TokenEvent, TokenRun
from ..tokenizers.base import Tokenizer
from ..tokenizers.conversions import Reason, record

__all__ = ["Delta", "OutputDecoder"]


@dataclass
class Delta:
    ids: list[int] = field(default_factory=list)
    text: str = ""
    events: Sequence[TokenEvent] = field(default_factory=list)
    """The tokens' events: a list, or a whole answer's `TokenRun` (no object per token)."""

    def __bool__(self) -> bool:
        return bool(self.ids or self.text)


class OutputDecoder:
    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = (), *,
                 token_aligned: bool = True, keep_stop_token: bool = False,
                 include_stop: bool = False, skip_special: bool = False,
                 min_tokens: int = 0, text: Reason | None = "output",
                 stop_at_end: bool = False):
        """`keep_stop_token`: on a stop string, keep the token that completed it (vLLM's rule
        for `token_ids`, used by /inference/v1/generate, which returns ids only).
        `include_stop`: that, and the text goes on to the stop string's end (vLLM's
        `include_stop_str_in_output`). `skip_special`: control tokens add no text (their ids
        still go out: the one place where the text is not the ids' text). `min_tokens`: the
        text of the first that many tokens is never matched against the stop strings (vLLM's
        rule: no stop string ends the output before `min_tokens`). `text`: why the output's
        text is read (the conversion's reason: "output", "tools", "policy"); None: nobody
        reads it (the deltas' text stays ""). `stop_at_end`: TGI's rule, a stop string matches
        only where the output so far ends with it (with `keep_stop_token`)."""
        self._tok = tokenizer
        self._at_end = stop_at_end
        self._aligned = token_aligned
        self._keep = keep_stop_token or include_stop
        self._include = include_stop
        self._skip = tokenizer.special_ids if skip_special else frozenset()
        self._unmatched = min_tokens  # tokens still to release without matching
        self._stops = [s.encode() for s in stop if s]
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held: list[TokenEvent] = []
        self._held_bytes: list[bytes] = []
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = text is not None
        # what the conversion is counted as, once, when the first token's bytes are read
        self._reason: Reason | None = text if text is not None else "stop" if self._stops \
            else None
        self._counted = False
        self.stop_string: str | None = None
        """The stop string that ended the output, once one has."""

    def push(self, ev: TokenEvent) -> Delta:
        """Take one sampled token; returns what can be released now (maybe empty)."""
        if self.stop_string is not None:
            return Delta()
        if self._reason is None:  # ids only: no bytes read, no text made
            return Delta(ids=[ev.token_id], events=[ev])
        if not self._counted:
            record("decode", self._reason)
            self._counted = True
        piece = b"" if ev.token_id in self._skip else self._tok.token_bytes(ev.token_id)
        if not self._stops or self._unmatched > 0:
            self._unmatched -= 1
            return self._release([ev], [piece])
        self._held.append(ev)
        self._held_bytes.append(piece)
        data = b"".join(self._held_bytes)
        hit = self._ending(data) if self._at_end else self._first_match(data)
        if hit is None:
            n = self._count_before(self._partial_start(data))
            delta = self._release(self._held[:n], self._held_bytes[:n])
            del self._held[:n], self._held_bytes[:n]
            return delta
        at, stop = hit
        self.stop_string = stop.decode()
        # the match completes inside the token just pushed, the last one held
        n = len(self._held) if self._keep else self._count_before(at)
        if self._include and not self._aligned:  # the text ends with the stop string
            delta = self._release(self._held, [data[:at + len(stop)]])
        else:
            delta = self._release(self._held[:n], self._held_bytes[:n])
        if not self._aligned and not self._include and self._text:
            # the text of the straddling token that precedes the stop string (not its id)
            released = sum(len(b) for b in self._held_bytes[:n])
            delta.text += self._utf8.decode(data[released:at])
        delta.text += self._utf8.decode(b"", final=True)  # nothing more will follow
        self._held, self._held_bytes = [], []
        return delta

    def push_run(self, run: TokenRun) -> Delta | None:
        """Take a run of sampled tokens at once, where no stop string can match in it (None:
        it must be pushed token by token)."""
        if self.stop_string is not None:
            return Delta()
        if self._stops and self._unmatched < len(run):
            return None
        self._unmatched -= len(run)
        ids = run.ids.tolist()
        if self._reason is None:
            return Delta(ids=ids, events=run)
        if not self._counted:
            record("decode", self._reason)
            self._counted = True
        if not self._text:
            return Delta(ids=ids, events=run)
        piece = self._tok.token_bytes
        skip = self._skip
        data = b"".join([b"" if t in skip else piece(t) for t in ids]) if skip \
            else b"".join([piece(t) for t in ids])
        return Delta(ids=ids, text=self._utf8.decode(data), events=run)

    def finish(self) -> Delta:
        """Release everything still held (no stop string can match any more)."""
        delta = Delta()
        if self.stop_string is None and self._held:
            delta = self._release(self._held, self._held_bytes)
            self._held, self._held_bytes = [], []
        delta.text += self._utf8.decode(b"", final=True)
        return delta

    # -- internals ---------------------------------------------------------------------------

    def _first_match(self, data: bytes) -> tuple[int, bytes] | None:
        """The stop string that completes first (as if the text arrived byte by byte)."""
        best: tuple[int, int, bytes] | None = None
        for s in self._stops:
            i = data.find(s)
            if i >= 0 and (best is None or (i + len(s), i) < best[:2]):
                best = (i + len(s), i, s)
        return (best[1], best[2]) if best is not None else None

    def _ending(self, data: bytes) -> tuple[int, bytes] | None:
        """The first stop string (in the request's order) the output so far ends with."""
        for s in self._stops:
            if data.endswith(s):
                return len(data) - len(s), s
        return None

    def _partial_start(self, data: bytes) -> int:
        """Earliest offset from which the tail of `data` could still grow into a stop string."""
        start = max(0, len(data) - self._longest + 1)
        for i in range(start, len(data)):
            tail = data[i:]
            if any(s.startswith(tail) for s in self._stops):
                return i
        return len(data)

    def _count_before(self, offset: int) -> int:
        """How many held tokens end at or before byte `offset` of the held text."""
        end = n = 0
        for b in self._held_bytes:
            end += len(b)
            if end > offset:
                break
            n += 1
        return n

    def _release(self, events: list[TokenEvent], pieces: list[bytes]) -> Delta:
        if not events:
            return Delta()
        return Delta(
            ids=[e.token_id for e in events],
            text=self._utf8.decode(b"".join(pieces)) if self._text else "",
            events=list(events),
        )

"""Reasoning split out of sampled ids: a partition, in order, never a re-encoding.

A thinking model writes `<think>` ... `</think>` then its answer (Qwen3, QwQ, DeepSeek-R1 and
its distills, SmolLM3...). `ReasoningSplitter` walks the sampled ids once and gives each id a
part: `reasoning`, `content`, or `marker` (the ids of `<think>` and `</think>` themselves), so the
parts joined are exactly the ids the model sampled. Markers come two ways:

- as one id (a control or user-defined token, as Qwen's and DeepSeek's vocabularies have them):
  matched as that id, so no BPE merge can hide one;
- as plain text over several ids (a vocabulary without such a token): matched on the bytes of
  the ids, across token and push boundaries. The ids that may begin a marker are held back until
  the marker is complete or ruled out, so a stream never shows half a marker as text. The ids
  that the marker's bytes touch are the marker's part (a token that joins the end of the
  reasoning with the marker's first bytes is marker too: the partition is of ids).

Where a choice starts is the prompt's business: a template whose generation prompt opens the
reasoning (`<think>\\n`, as Qwen 3.5's and DeepSeek-R1's do) has the model start inside it,
which `starts_inside` finds from the prompt ids. vLLM's parsers name these formats
`deepseek_r1` and `qwen3` (its `vllm/reasoning/basic_parsers.py` is the same split on text).

`ReasoningStream` puts the split after the output decoder (stop strings match the whole output,
reasoning included, as vLLM's do) and gives each part the text of its own ids:
serving/generation.py runs one per choice, so every API's stream is split in one place.
"""

from __future__ import annotations

import codecs
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..engines.base import TokenEvent
from ..tokenizers.base import Tokenizer
from .output import Delta

__all__ = ["PARSERS", "Part", "ReasoningFormat", "ReasoningSplitter", "ReasoningStream",
           "reasoning_format"]

Part = Literal["reasoning", "content", "marker"]


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    """vLLM's name for the parser (`--reasoning-parser`)."""
    start: str
    end: str
    start_id: int | None
    """The marker's own id, where the vocabulary has one (else it is matched as text)."""
    end_id: int | None

    def starts_inside(self, tokenizer: Tokenizer, prompt: Sequence[int]) -> bool:
        """Does the prompt leave the model inside its reasoning (a start marker after the last
        end marker)?"""
        if self.start_id is not None and self.end_id is not None:
            for i in reversed(prompt):
                if i == self.start_id:
                    return True
                if i == self.end_id:
                    return False
            return False
        tail = tokenizer.decode(prompt[-64:])
        return tail.rfind(self.start) > tail.rfind(self.end)

    def opened(self, tokenizer: Tokenizer, ids: Sequence[int]) -> bool:
        """Do sampled ids begin inside the reasoning (an end marker before any start marker:
        their prompt opened it, as DeepSeek-R1's and Qwen 3.5's generation prompts do)?"""
        if self.start_id is not None and self.end_id is not None:
            for i in ids:
                if i == self.end_id:
                    return True
                if i == self.start_id:
                    return False
            return False
        text = tokenizer.decode(ids)
        end, start = text.find(self.end), text.find(self.start)
        return end >= 0 and not 0 <= start < end

    def opening(self, tokenizer: Tokenizer, prompt: Sequence[int]) -> list[int]:
        """The ids a generation prompt that leaves the model inside its reasoning ends with,
        from its start marker on (`<think>\\n`); [] for one that does not."""
        if not self.starts_inside(tokenizer, prompt):
            return []
        if self.start_id is not None:
            at = len(prompt) - 1 - list(reversed(prompt)).index(self.start_id)
            return list(prompt[at:])
        for at in range(len(prompt) - 1, -1, -1):  # the last id the marker's text begins in
            if self.start in tokenizer.decode(prompt[at:]):
                return list(prompt[at:])
        return []

    def closed(self, tokenizer: Tokenizer, prompt: Sequence[int]) -> bool:
        """Does the generation prompt close the reasoning itself (an end marker among its last
        ids: Qwen3's `<think>\\n\\n</think>\\n\\n` under `enable_thinking: false`)?"""
        tail = prompt[-_CLOSED_WITHIN:]
        if self.end_id is not None:
            return self.end_id in tail
        return self.end in tokenizer.decode(tail)

    def strip(self, tokenizer: Tokenizer, ids: Sequence[int]) -> list[int]:
        """A sampled turn's ids without its reasoning: the markers, what lies between them,
        and the newline-only ids right after the end marker (what `content.split('</think>')
        [-1].lstrip('\\n')` leaves of the text, as Qwen3's and DeepSeek-R1's templates drop
        it, done on ids: nothing is encoded again; a newline merged into the answer's first
        id stays)."""
        # a turn whose prompt opened the reasoning (R1's, Qwen 3.5's) starts inside it
        split = ReasoningSplitter(tokenizer, self, inside=self.opened(tokenizer, ids))
        runs = split.push(ids) + split.finish()
        out: list[int] = []
        after_marker = False
        for part, run in runs:
            if part == "content":
                if after_marker:
                    k = 0
                    while k < len(run) and tokenizer.token_bytes(run[k]).strip(b"\n") == b"" \
                            and tokenizer.token_bytes(run[k]):
                        k += 1
                    run = run[k:]
                out += run
            after_marker = part == "marker"
        return out


_CLOSED_WITHIN = 8
"""How near its end a generation prompt that closes the reasoning has the end marker."""

#: template text -> (vLLM's parser name, start marker, end marker), the first that matches
_FORMATS = [("deepseek_r1", "<｜Assistant｜>", "<think>", "</think>"),
            ("qwen3", "<think>", "<think>", "</think>")]

PARSERS = tuple(name for name, *_ in _FORMATS)
"""The reasoning parsers there are (vLLM's names)."""


def reasoning_format(template: str | None, tokenizer: Tokenizer,
                     name: str | None = None) -> ReasoningFormat | None:
    """The format a chat template writes reasoning in (or the one `name`d, vLLM's parser
    names); None for a template with no reasoning markers."""
    for parser, sign, start, end in _FORMATS:
        if (name == parser) or (name is None and template is not None and sign in template
                                and start in template and end in template):
            ids = tokenizer.special_tokens
            return ReasoningFormat(parser, start, end, _single_id(tokenizer, start, ids),
                                   _single_id(tokenizer, end, ids))
    return None


def _single_id(tokenizer: Tokenizer, text: str, specials: dict[str, int]) -> int | None:
    if text in specials:
        return specials[text]
    ids = tokenizer.encode(text, parse_special=True)  # a user-defined token is one id
    return ids[0] if len(ids) == 1 else None


class ReasoningSplitter:
    """One choice's sampled ids, pushed as they come, out as (part, ids) runs in order."""

    def __init__(self, tokenizer: Tokenizer, fmt: ReasoningFormat, *, inside: bool):
        self._tok = tokenizer
        self._fmt = fmt
        self._inside = inside
        self._held: list[int] = []  # ids that may begin a text marker
        self.reasoning_ids = 0
        """How many ids were reasoning so far (`reasoning_tokens` in usage)."""

    @property
    def _marker(self) -> tuple[str, int | None]:
        fmt = self._fmt
        return (fmt.end, fmt.end_id) if self._inside else (fmt.start, fmt.start_id)

    def push(self, ids: Sequence[int]) -> list[tuple[Part, list[int]]]:
        out: list[tuple[Part, list[int]]] = []
        for i in ids:
            self._step(i, out)
        return _joined(out)

    def finish(self) -> list[tuple[Part, list[int]]]:
        """The ids still held (a marker never completed: they are what they looked like)."""
        out: list[tuple[Part, list[int]]] = []
        if self._held:
            self._emit(self._here, self._held, out)
            self._held = []
        return out

    @property
    def _here(self) -> Part:
        return "reasoning" if self._inside else "content"

    def _emit(self, part: Part, ids: list[int], out: list[tuple[Part, list[int]]]) -> None:
        if part == "reasoning":
            self.reasoning_ids += len(ids)
        out.append((part, list(ids)))

    def _step(self, i: int, out: list[tuple[Part, list[int]]]) -> None:
        text, marker_id = self._marker
        if marker_id is not None:
            if i == marker_id:
                self._emit("marker", [i], out)
                self._inside = not self._inside
            else:
                self._emit(self._here, [i], out)
            return
        self._held.append(i)
        held = self._bytes(self._held)
        marker = text.encode()
        at = held.find(marker)
        if at >= 0:
            self._split_at_marker(held, at, len(marker), out)
            return
        # hold only the ids under the longest end of the bytes that begins the marker
        begins = max((n for n in range(1, len(marker)) if held.endswith(marker[:n])), default=0)
        keep, size = len(self._held), 0
        while keep and size < begins:
            keep -= 1
            size += len(self._tok.token_bytes(self._held[keep]))
        if keep:
            self._emit(self._here, self._held[:keep], out)
            self._held = self._held[keep:]

    def _bytes(self, ids: Sequence[int]) -> bytes:
        return b"".join(self._tok.token_bytes(i) for i in ids)

    def _split_at_marker(self, held: bytes, at: int, size: int,
                         out: list[tuple[Part, list[int]]]) -> None:
        """The held ids hold the marker's bytes [at, at + size): ids wholly before it stay in
        the current part, ids that touch it are the marker's, the rest are pushed again."""
        ids, self._held = self._held, []
        pos, before, marker, after = 0, [], [], []
        for i in ids:
            n = len(self._tok.token_bytes(i))
            if pos + n <= at:
                before.append(i)
            elif pos < at + size:
                marker.append(i)
            else:
                after.append(i)
            pos += n
        if before:
            self._emit(self._here, before, out)
        self._emit("marker", marker, out)
        self._inside = not self._inside
        for i in after:
            self._step(i, out)


def _joined(runs: list[tuple[Part, list[int]]]) -> list[tuple[Part, list[int]]]:
    out: list[tuple[Part, list[int]]] = []
    for part, ids in runs:
        if out and out[-1][0] == part and part != "marker":
            out[-1][1].extend(ids)
        elif ids:
            out.append((part, list(ids)))
    return out


class ReasoningStream:
    """One choice's deltas (the output decoder's, in order) as (part, delta) runs: the split of
    `ReasoningSplitter`, each part's text decoded from its own ids (a marker shows none), each
    id with its event. `text`: False where nobody reads text (ids only)."""

    def __init__(self, tokenizer: Tokenizer, fmt: ReasoningFormat, *, inside: bool,
                 skip: frozenset[int] = frozenset(), text: bool = True):
        self.splitter = ReasoningSplitter(tokenizer, fmt, inside=inside)
        self._tok = tokenizer
        self._skip = skip
        self._text = text
        self._utf8: dict[Part, codecs.IncrementalDecoder] = {
            part: codecs.getincrementaldecoder("utf-8")(errors="replace")
            for part in ("reasoning", "content")}
        self._events: deque[TokenEvent] = deque()  # of ids the splitter still holds
        self._part: Part | None = None  # the text part the last ids went to

    def push(self, delta: Delta, *, last: bool = False) -> list[tuple[Part, Delta]]:
        """`last`: nothing follows (what is held is released, half characters replaced)."""
        self._events.extend(delta.events)
        runs = self.splitter.push(delta.ids)
        if last:
            runs = _joined(runs + self.splitter.finish())
        out: list[tuple[Part, Delta]] = []
        for part, ids in runs:
            if part == "marker":
                self._flush(out)  # the part it ends lets go of a character cut short
            else:
                self._part = part
            out.append((part, self._delta(part, ids)))
        if last:
            self._flush(out)
        return out

    def _flush(self, out: list[tuple[Part, Delta]]) -> None:
        """The bytes of an incomplete character the current part still holds, as U+FFFD at its
        end (in order: before the marker that ends the part)."""
        if self._part is None:
            return
        rest = self._utf8[self._part].decode(b"", final=True)
        if rest and out and out[-1][0] == self._part:
            out[-1][1].text += rest
        elif rest:
            out.append((self._part, Delta(text=rest)))

    def _delta(self, part: Part, ids: list[int]) -> Delta:
        events = [self._events.popleft() for _ in range(min(len(ids), len(self._events)))]
        if part == "marker" or not self._text:
            return Delta(ids, "", events)
        data = b"".join(b"" if i in self._skip else self._tok.token_bytes(i) for i in ids)
        return Delta(ids, self._utf8[part].decode(data), events)

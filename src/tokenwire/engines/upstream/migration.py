"""Request migration: a sequence whose replica is lost mid-response goes on on another one.

The gateway holds every id it has passed on, so it can do what NVIDIA Dynamo's request migration
does: submit prompt + the ids already sent to another healthy replica (the lost one is marked
down, so admission skips it), with what is left of `max_tokens` and `min_tokens`, and pass on
that continuation's events as if nothing had happened. The client sees one stream of exact ids:
under greedy sampling the continuation is the same computation as the uninterrupted run (the
sent ids are read as prompt, as they were read as context); under seeded sampling the
continuation is seeded again, so it is a valid draw but not the uninterrupted run's draw.

What cannot be continued gives up as before (the caller's `ReplicaLostError`, which a stream
turns into its in-band 503):
- a grammar-constrained sequence with ids already sent: the upstream's grammar (vLLM's xgrammar,
  llama-server's GBNF) starts at the first output token and takes no state to start from;
- presence or frequency penalties with ids already sent: the upstreams count them over the
  output only, so the continuation would see a different distribution;
- no healthy replica left, or `upstream_migrations` moves already made.
A sequence lost before its first id is simply submitted again (nothing has reached anyone).

The finish says so: `FinishEvent.migrations` names each move (the serving layer warns with
`request_migrated`), the continuation's weight-version spans are shifted to the whole output's
indexes, and its prefix-cache count is dropped (it is the continuation's, not the request's).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from ...config import Settings
from ..base import (
    EngineEvent,
    FinishEvent,
    ReplicaLostError,
    SamplingParams,
    TokenEvent,
    TokenRun,
    WeightSpan,
)
from .stream import UpstreamStream

__all__ = ["MigratingStream", "why_not_continued"]

log = logging.getLogger(__name__)


def why_not_continued(params: SamplingParams, n_sent: int) -> str | None:
    """Why a sequence that has passed on `n_sent` ids cannot go on elsewhere (None: it can)."""
    if n_sent == 0:
        return None
    if params.grammar is not None:
        return "a constrained sequence cannot carry its grammar's state to another replica"
    if params.presence_penalty or params.frequency_penalty:
        return ("presence and frequency penalties count the output only: another replica "
                "would see the ids sent so far as prompt")
    return None


class _Owner(Protocol):
    """What a moving stream needs of its engine (engine.py's `UpstreamEngine`, which imports
    this module)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def on_migration(self) -> Callable[[str], None] | None: ...
    async def admit(self, prompt: Sequence[int], params: SamplingParams) -> UpstreamStream: ...


class MigratingStream:
    """An upstream sequence's events, moved to another replica when its own is lost."""

    def __init__(self, engine: _Owner, prompt: Sequence[int], params: SamplingParams,
                 inner: UpstreamStream):
        self._engine = engine
        self._prompt = list(prompt)
        self._params = params
        self._inner = inner
        self._sent: list[int] = []
        self._moves: list[str] = []
        self._offset = 0
        """Output ids before the current replica's part (its spans start there)."""
        self._version = _version_of(inner)
        """The weights label the current replica reported when it took the sequence."""
        self._lost: list[WeightSpan | None] = []
        """Each lost replica's part: its span where its weights are known, else None."""

    def __aiter__(self) -> MigratingStream:
        return self

    @property
    def ready(self) -> bool:
        return self._inner.ready

    async def __anext__(self) -> EngineEvent:
        while True:
            got: EngineEvent | None
            try:
                got = await self._inner.__anext__()
            except ReplicaLostError as exc:
                got = await self._move(exc)
            if got is not None:
                break
        ev = got
        if isinstance(ev, TokenEvent):
            self._sent.append(ev.token_id)
        elif isinstance(ev, TokenRun):
            self._sent += ev.ids
        elif isinstance(ev, FinishEvent):
            suffix = _adapter_of(self._inner, self._params)
            if suffix and ev.weight_versions is not None:  # the adapter's version, named
                ev = replace(ev, weight_versions=tuple(replace(w, version=w.version + suffix)
                                                       for w in ev.weight_versions))
            if self._moves:
                ev = self._finished(ev)
        return ev

    async def _move(self, lost: ReplicaLostError) -> EngineEvent | None:
        """Go on elsewhere (None: the next event comes from the new replica), finish here when
        nothing is left to sample, or raise `lost` when the sequence cannot go on."""
        why = why_not_continued(self._params, len(self._sent))
        if why is None and len(self._moves) >= self._engine.settings.upstream_migrations:
            why = f"it has moved {len(self._moves)} times already (upstream_migrations)"
        if why is not None:
            self._count("gave_up")
            log.warning("not moving a lost sequence: %s", why)
            raise lost
        left = self._params.max_tokens - len(self._sent)
        # the lost replica's part is the version it reported at admission, if it reported
        # the same one last (weights change only paused, and a pause would have drained it)
        label = _version_of(self._inner)
        known = label is not None and label == self._version
        if len(self._sent) > self._offset:
            self._lost.append(WeightSpan(label + _adapter_of(self._inner, self._params),
                                         self._offset, len(self._sent))
                              if known and label is not None else None)
        note = f"{lost} after {len(self._sent)} tokens; continued on another replica" + (
            "" if known else " (the weights that sampled the lost replica's part carry no "
            "version: its weight_versions span is missing)")
        self._moves.append(note)
        if left <= 0:  # every token was sent; only the finish was lost
            self._count("moved")
            return FinishEvent("length")
        params = replace(self._params, max_tokens=left,
                         min_tokens=max(0, self._params.min_tokens - len(self._sent)))
        try:
            self._inner = await self._engine.admit(self._prompt + self._sent, params)
        except Exception:
            self._count("gave_up")
            raise lost from None
        self._offset = len(self._sent)
        self._version = _version_of(self._inner)
        self._count("moved")
        log.warning("moved a sequence: %s", note)
        return None

    def _count(self, outcome: str) -> None:
        if self._engine.on_migration is not None:
            self._engine.on_migration(outcome)

    def _finished(self, ev: FinishEvent) -> FinishEvent:
        """The finish of the whole sequence: spans over its whole output (each lost part's
        where its version is known; a part that is not has no span, and its move's note says
        so), no cached count (the continuation's is not the request's)."""
        spans = None
        if ev.weight_versions is not None:
            shifted = [WeightSpan(w.version, w.start + self._offset, w.end + self._offset)
                       for w in ev.weight_versions]
            merged: list[WeightSpan] = []
            for w in [*(w for w in self._lost if w is not None), *shifted]:
                if merged and merged[-1].version == w.version and merged[-1].end == w.start:
                    merged[-1] = WeightSpan(w.version, merged[-1].start, w.end)
                else:
                    merged.append(w)
            spans = tuple(merged)
        moves = tuple(self._moves)
        if ev.routed_experts is not None and moves:
            # the continuation's routing covers its own prompt, not the sequence as sampled
            moves = (*moves[:-1], moves[-1] + " (routed_experts dropped: the replica that "
                     "finished it routed a different prompt)")
        return replace(ev, weight_versions=spans, cached_tokens=None, routed_experts=None
                       if moves else ev.routed_experts, migrations=moves)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _version_of(stream: UpstreamStream) -> str | None:
    """The weights label the replica serving `stream` last reported."""
    return stream.replica.weight_version


def _adapter_of(stream: UpstreamStream, params: SamplingParams) -> str:
    """What a sample's version label adds for its adapter: `+lora:<name>@<version>` (as the
    embedded engine labels weights with adapters); "" for the base weights."""
    if params.adapter is None:
        return ""
    _, version = stream.replica.adapters.get(params.adapter, ("", "?"))
    return f"+lora:{params.adapter}@{version}"

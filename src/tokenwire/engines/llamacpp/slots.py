"""The embedded engine's prefix cache: which sequence slot a prompt gets and where its cached
prefix comes from, keyed on token ids alone.

A slot's KV cells outlive the request that filled them: a free slot remembers the ids its cells
hold (never more than the cells hold, so the table is bounded by the KV cache itself). A new
prompt reuses the longest prefix any slot holds, free or running: in place when it gets that
slot, else by a copy of the holder's stream. Nothing here touches llama.cpp; the engine applies
the `Placement`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MIN_COPY", "Placement", "Slots", "common_prefix"]

MIN_COPY = 16
"""Fewest shared ids worth copying another slot's stream for (a copy moves the whole stream,
n_ctx_seq cells, where prefilling a few ids costs less)."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.asarray(a[:n]) != np.asarray(b[:n])
    first = int(diff.argmax())
    return first if diff[first] else n


@dataclass(frozen=True)
class Placement:
    slot: int
    """The slot the prompt gets."""
    source: int
    """The slot holding the longest shared prefix (`slot` itself when reused in place)."""
    shared: int
    """How many leading prompt ids `source` holds."""
    own: int
    """How many of them `slot` itself held (all of them when reused in place)."""


class Slots:
    """Free slots and what each one's cells still hold. Not thread safe: the engine calls it
    under its lock."""

    def __init__(self, n: int):
        self.free: list[int] = list(range(n))
        self._held: dict[int, list[int]] = {}
        self._salts: dict[int, str | None] = {}  # slot -> the cache_salt of what it holds
        self._released: dict[int, int] = {}  # slot -> release order, for least recently used
        self._clock = 0

    def held(self, slot: int) -> Sequence[int]:
        return self._held.get(slot, ())

    def _reusable(self, salt: str | None) -> dict[int, list[int]]:
        """What free slots hold that a request with `salt` may reuse (only its own tenant's:
        a salt isolates the cache, as vLLM's `cache_salt` does)."""
        return {slot: ids for slot, ids in self._held.items() if self._salts.get(slot) == salt}

    def best_source(self, prompt: Sequence[int], live: Mapping[int, Sequence[int]],
                    salt: str | None = None) -> tuple[int, int]:
        """(slot, shared): the slot, free or running (`live`: slot -> ids in its cells, of
        sequences with the same `salt`), whose cells share the longest prefix with `prompt`;
        (-1, 0) when none shares any."""
        best, best_slot = 0, -1
        for slot, ids in [*self._reusable(salt).items(), *live.items()]:
            n = common_prefix(ids, prompt)
            if n > best:
                best, best_slot = n, slot
        return best_slot, best

    def take(self, prompt: Sequence[int], live: Mapping[int, Sequence[int]],
             salt: str | None = None) -> Placement:
        """Take a free slot for `prompt` (there must be one). A free slot holding the longest
        shared prefix is reused in place, unless that would cut off much more than it shares
        (a conversation's history, useful to its next turn) while a cheap slot is free; then,
        and otherwise, the cheapest cache to lose goes (an empty slot, then one whose ids
        another slot also holds, then the least recently used; the lowest id first), and the
        engine copies the prefix from its holder."""
        source, shared = self.best_source(prompt, live, salt)

        def cost(slot: int) -> tuple[int, int, int]:
            ids = self._held.get(slot)
            if not ids:
                return (0, 0, slot)
            mine = self._salts.get(slot)  # a duplicate must be reusable by the same tenants
            others = [*self._reusable(mine).items(), *(live.items() if mine == salt else ())]
            duplicate = any(o != slot and len(o_ids) >= len(ids)
                            and common_prefix(o_ids, ids) == len(ids) for o, o_ids in others)
            return (1, 0, slot) if duplicate else (2, self._released.get(slot, 0), slot)

        slot = min(self.free, key=cost)
        if source in self.free:
            lost = len(self.held(source)) - shared
            if lost <= MIN_COPY or cost(slot)[0] == 2 or slot == source:
                slot = source
        self.free.remove(slot)
        held = self._held.pop(slot, ())  # the engine's to track from now
        own = common_prefix(held, prompt) if self._salts.pop(slot, None) == salt else 0
        return Placement(slot, source if shared else slot, shared, own)

    def clear(self) -> list[int]:
        """Forget what every free slot holds (new weights: no KV of the old ones is reused);
        the slots that held something, whose cells the engine clears."""
        held = list(self._held)
        self._held.clear()
        self._salts.clear()
        return held

    def release(self, slot: int, ids: list[int] | None, salt: str | None = None) -> None:
        """Free `slot`; `ids`: what its cells still hold (None: nothing worth reusing), filled
        by a request with `salt`."""
        self._clock += 1
        self._released[slot] = self._clock
        if ids:
            self._held[slot] = ids
            self._salts[slot] = salt
        else:
            self._held.pop(slot, None)
            self._salts.pop(slot, None)
        self.free.append(slot)

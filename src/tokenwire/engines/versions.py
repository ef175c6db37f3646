"""Weight versions in order, and which replicas a staleness bound lets serve a request.

Labels are free strings (vLLM's `weight_version`); they are ordered by the order in which the
fleet was given them, as a box sees it: a label is placed when the box first meets it, through a
control call it passes on or a replica's own `/weight_info`. Labels first met together (a box
started in the middle of a rolling update sees two at once) are placed in natural order
("step-9" before "step-10"), which is right for the numbered labels trainers write. What a
replica serves is what it reports, never what a box remembers pushing: several boxes in front of
one fleet route alike.

A bound (`WeightBound`, weights.py) is smg's version policy (`--rl-version-policy`: `any`,
`latest-only`, `min-version:<v>`, `max-staleness:<k>`) as a request's fields: `min_weight_version`
(that version or a later one) and `max_staleness` (at most k versions behind the newest a replica
of the fleet serves; 0 is latest-only).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from ..errors import WeightVersionUnavailableError
from ..weights import WeightBound, parse_policy

__all__ = ["VersionOrder", "WeightBound", "parse_policy"]

_MEMORY = 4096
"""Labels an order remembers: a bound naming one forgotten since is treated as never seen."""


def _natural(label: str) -> list[tuple[int, int | str]]:
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", label) if p]


class VersionOrder:
    """The labels a box has met, in order (the latest `_MEMORY`)."""

    def __init__(self) -> None:
        self._rank: OrderedDict[str, int] = OrderedDict()
        self._next = 0

    def see(self, labels: Iterable[str | None]) -> None:
        """Place the labels not met before, after every label met before."""
        new = sorted({x for x in labels if x is not None and x not in self._rank}, key=_natural)
        for label in new:
            self._rank[label] = self._next
            self._next += 1
            if len(self._rank) > _MEMORY:
                self._rank.popitem(last=False)

    def rank(self, label: str | None) -> int | None:
        return None if label is None else self._rank.get(label)

    def admits(self, bound: WeightBound, versions: Sequence[str | None],
               serving: Sequence[bool] | None = None) -> list[bool]:
        """Which of the replicas serving `versions` (None: unknown) the bound lets serve;
        staleness counts from the newest version among the replicas `serving` now (all, by
        default): one that is down or held keeps no request waiting for its version."""
        ranks = [self.rank(v) for v in versions]
        live = serving if serving is not None else [True] * len(ranks)
        newest = max((r for r, up in zip(ranks, live, strict=True) if r is not None and up),
                     default=None)
        floor = None if bound.min_version is None else self.rank(bound.min_version)
        out = []
        for r in ranks:
            ok = r is not None
            if r is not None and bound.min_version is not None:
                ok = floor is not None and r >= floor
            if r is not None and ok and bound.max_staleness is not None:
                ok = newest is not None and newest - r <= bound.max_staleness
            out.append(ok)
        return out

    def unavailable(self, bound: WeightBound, present: Sequence[tuple[str, str | None, str]],
                    ) -> WeightVersionUnavailableError:
        """The refusal of a request no replica could serve within its wait; `present`: each
        replica's name, version and state."""
        held = "; ".join(f"{name}: {version!r} ({state})" for name, version, state in present)
        unknown = (bound.min_version is not None and self.rank(bound.min_version) is None)
        return WeightVersionUnavailableError(
            f"no replica serves weights within {bound.describe()} after {bound.wait:g} s"
            + (f" ({bound.min_version!r} was never served)" if unknown else "")
            + f"; present: {held or 'none'}", param=bound.param)


"""One replica's state: where it is, what it serves, whether it may be used now, its load."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..base import ReplicaHealth
from .board import Board

__all__ = ["Replica", "Seat", "UpstreamInfo"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpstreamInfo:
    """What a replica says about the model it serves."""

    model: str
    max_model_len: int
    mode: str = ""
    """Engine-specific: which of its APIs this replica speaks (e.g. vLLM's generate or
    completions)."""


@dataclass(eq=False)
class Replica:
    """One upstream server. Health checks bring it `up` and set `info` (health.py); admission
    counts its load on the box's board (engine.py, stream.py), which every worker reads."""

    url: str
    name: str
    """How clients hear of it ("replica 2"): error messages do not show internal addresses."""
    index: int
    board: Board = field(repr=False)
    reason: str | None = "not checked yet"
    info: UpstreamInfo | None = None
    """Set once the replica is verified (model, context, tokenizer)."""
    refused: str | None = None
    """Why this replica may never be used (it serves another model or tokenizer)."""
    weight_version: str | None = None
    """Its weights' label as it last reported it (health checks, control answers)."""
    paused: bool = False
    """Paused, as it last reported (`/is_paused`) or a control call through this box set."""
    adapters: dict[str, tuple[str, str]] = field(default_factory=dict)
    """The LoRA adapters it serves: name -> (path, version), as it last reported them."""
    _up: bool = False
    _seen: int = 0
    """The board's down count when this worker last brought it up."""

    @property
    def healthy(self) -> bool:
        """Up by this worker's last check, and not found down since by any worker."""
        if self._up and self.board.downs(self.index) != self._seen:
            self._up, self.info = False, None  # verified again by this worker's next check
            self.reason = self.board.down_reason(self.index) + " (found by another worker)"
        return self._up

    def up(self) -> None:
        self._up, self.reason, self._seen = True, None, self.board.downs(self.index)

    def down(self, reason: str) -> None:
        """Not used until a health check passes, and verified again then (it may come back
        as another model: a rolling upgrade); every worker of the box stops using it."""
        if self._up:
            log.warning("upstream %s (%s) is down: %s", self.url, self.name, reason)
            self.board.found_down(self.index, reason)
        self._up = False
        self.reason = reason
        self.info = None

    @property
    def held(self) -> bool:
        """Held out of routing by a rolling update (by any worker of the box)."""
        return self.board.held(self.index)

    def seat(self) -> Seat:
        """A request's place in this replica's in-flight count, from its send to its end."""
        return Seat(self)

    @property
    def in_flight(self) -> int:
        """Requests running there from every worker of the box."""
        return self.board.in_flight(self.index)

    @property
    def served(self) -> int:
        return self.board.served(self.index)

    def snapshot(self) -> ReplicaHealth:
        healthy = self.healthy
        return ReplicaHealth(url=self.url, name=self.name, healthy=healthy,
                             reason=None if healthy else (self.refused or self.reason),
                             in_flight=self.in_flight, served=self.served,
                             weight_version=self.weight_version,
                             paused=self.paused or self.held)


class Seat:
    """One request in a replica's in-flight count; `release` (any number of times) ends it."""

    __slots__ = ("_replica",)

    def __init__(self, replica: Replica):
        self._replica: Replica | None = replica
        replica.board.enter(replica.index)

    def release(self) -> None:
        if self._replica is not None:
            self._replica.board.leave(self._replica.index)
            self._replica = None

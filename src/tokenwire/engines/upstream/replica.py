"""One replica's state: where it is, what it serves, whether it may be used now, its load."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..base import ReplicaHealth

__all__ = ["Replica", "UpstreamInfo"]

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
    """One upstream server. Health checks set `healthy` and `info` (health.py); admission
    counts `in_flight` and `served` (engine.py, stream.py)."""

    url: str
    name: str
    """How clients hear of it ("replica 2"): error messages do not show internal addresses."""
    healthy: bool = False
    reason: str | None = "not checked yet"
    info: UpstreamInfo | None = None
    """Set once the replica is verified (model, context, tokenizer)."""
    refused: str | None = None
    """Why this replica may never be used (it serves another model or tokenizer)."""
    in_flight: int = 0
    served: int = 0

    def down(self, reason: str) -> None:
        """Not used until a health check passes, and verified again then (it may come back
        as another model: a rolling upgrade)."""
        if self.healthy:
            log.warning("upstream %s (%s) is down: %s", self.url, self.name, reason)
        self.healthy = False
        self.reason = reason
        self.info = None

    def snapshot(self) -> ReplicaHealth:
        return ReplicaHealth(url=self.url, name=self.name, healthy=self.healthy,
                             reason=None if self.healthy else (self.refused or self.reason),
                             in_flight=self.in_flight, served=self.served)

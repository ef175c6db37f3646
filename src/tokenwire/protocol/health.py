"""Wire models of GET /health."""

from __future__ import annotations

from typing import Literal

from ._base import ResponseModel

__all__ = ["Health", "ModelHealth", "ReplicaHealthInfo"]


class ReplicaHealthInfo(ResponseModel):
    """One upstream replica of a gateway."""

    url: str
    name: str
    healthy: bool
    reason: str | None = None
    """Why it is not serving (the last failure), when it is not."""
    in_flight: int = 0
    served: int = 0
    """Requests admitted on this replica since start."""


class ModelHealth(ResponseModel):
    ok: bool
    """Can serve a request now (at least one replica is healthy)."""
    reason: str | None = None
    replicas: list[ReplicaHealthInfo] = []


class Health(ResponseModel):
    omit_if_none = frozenset({"models"})
    status: Literal["ok", "unavailable"]
    """"ok" (200) while every model can serve, "unavailable" (503) when one cannot."""
    models: dict[str, ModelHealth] | None = None
    """Per model, when a replica is listed or a model cannot serve; only for a caller with a
    valid key when keys are set."""

"""Wire models of GET /health."""

from __future__ import annotations

from typing import Literal

from ._base import ResponseModel

__all__ = ["EngineProcessInfo", "Health", "ModelHealth", "ReplicaHealthInfo"]


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


class EngineProcessInfo(ResponseModel):
    """The embedded engine's process."""

    state: Literal["starting", "up", "restarting", "failed", "stopped"]
    pid: int | None = None
    restarts: int = 0
    """Times it was started again after it died."""
    last_exit: str | None = None
    """How it last died (SIGSEGV, SIGKILL, ...), or why it could not be restarted."""
    backend: str | None = None
    """The CPU and the ggml CPU variant it runs."""


class ModelHealth(ResponseModel):
    omit_if_none = frozenset({"engine_process"})
    ok: bool
    """Can serve a request now (at least one replica is healthy)."""
    reason: str | None = None
    replicas: list[ReplicaHealthInfo] = []
    engine_process: EngineProcessInfo | None = None
    """The embedded engine's process: its pid, restarts and CPU kernels."""


class Health(ResponseModel):
    omit_if_none = frozenset({"models"})
    status: Literal["ok", "unavailable"]
    """"ok" (200) while every model can serve, "unavailable" (503) when one cannot."""
    models: dict[str, ModelHealth] | None = None
    """Per model, when a replica is listed or a model cannot serve; only for a caller with a
    valid key when keys are set."""

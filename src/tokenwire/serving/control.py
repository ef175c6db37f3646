"""The control plane (vLLM's RL endpoints): who may call it, which engines it reaches, and one
answer made of every replica's.

A call reaches every served model's engine (a vLLM server serves one model; a tokenwire with
several applies a pause to the whole server). Only admin keys may call it (a keyless server:
loopback clients only, as raw prompts), and each call is logged with its caller. The answer is
vLLM's body (the replicas agree on it) plus `replicas`, each replica's status and body; a
replica that failed, or replicas that disagree, make a 502 `replica_failed` naming them, with
the same `replicas`: never a 200 that hides it. `weight_info` alone answers 200 when versions
differ (a rolling update): `weight_version` null, each replica's in `replicas`.
"""

from __future__ import annotations

import logging
from typing import Any

from ..config import Settings
from ..engines.base import CONTROL_OPS, ControlAnswer, ControlCall
from ..errors import (
    InvalidRequestError,
    PermissionDeniedError,
    ReplicaControlError,
    UnsupportedParameterError,
)
from ..protocol.control import RollingUpdateBody
from .models import ModelRegistry
from .rolling import RollingUpdates
from .service import Caller

__all__ = ["ControlService"]

log = logging.getLogger(__name__)


def _who(caller: Caller, host: str | None) -> str:
    key = caller.api_key
    return f"key …{key[-4:]}" if key else f"keyless client {host}"


class ControlService:
    def __init__(self, models: ModelRegistry, settings: Settings):
        self._models = models
        self._settings = settings
        self._rolls = RollingUpdates(models)

    async def roll(self, body: RollingUpdateBody, caller: Caller,
                   host: str | None) -> dict[str, Any]:
        """A rolling update (rolling.py)."""
        self.authorize("rolling_update", caller, host)
        log.info("control rolling_update to %r by %s", body.weight_version, _who(caller, host))
        return await self._rolls.run(body)

    def authorize(self, op: str, caller: Caller, host: str | None) -> None:
        """Refuse a caller who may not call `op` (before its body is read)."""
        if op not in CONTROL_OPS and op != "rolling_update":
            raise InvalidRequestError(f"no control call {op!r}")
        if not self._settings.control_allowed(caller.api_key, host):
            log.warning("control %s refused: %s is not an admin", op, _who(caller, host))
            raise PermissionDeniedError(
                f"{op} is a control-plane call: it needs an admin key (TOKENWIRE_ADMIN_KEYS)"
                " or, on a server without keys, a loopback client")

    async def call(self, call: ControlCall, caller: Caller, host: str | None) -> dict[str, Any]:
        self.authorize(call.op, caller, host)
        log.info("control %s %s by %s", call.op, dict(call.query), _who(caller, host))
        answers: list[tuple[str, ControlAnswer]] = []
        for m in self._models.all():
            if not m.engine.info.control_plane:
                raise UnsupportedParameterError(
                    f"model {m.id!r}: its engine has no control plane ({call.op})",
                    param=call.op)
            answers += [(m.id, a) for a in await m.engine.control(call)]
        replicas = [{"model": mid, "replica": a.replica, "status": a.status, "body": a.body}
                    for mid, a in answers]
        failed = [(mid, a) for mid, a in answers if not a.ok]
        if failed:
            raise ReplicaControlError(
                f"{call.op} failed on {len(failed)} of {len(answers)} replicas: " + "; ".join(
                    f"{a.replica} of {mid} answered {a.status}: {str(a.body)[:200]}"
                    for mid, a in failed), replicas=replicas)
        bodies = [a.body for _, a in answers]
        merged = bodies[0] if bodies and isinstance(bodies[0], dict) else {}
        if call.op == "weight_info" and len({str(b) for b in bodies}) > 1:
            # replicas may hold different versions (a rolling update, or one that stopped):
            # no version is the fleet's, and each replica's is in `replicas`
            return {"weight_version": None, "replicas": replicas}
        differ = sorted({k for b in bodies if isinstance(b, dict) for k in b
                         if b.get(k) != merged.get(k)})
        if differ:
            raise ReplicaControlError(
                f"the replicas disagree on {', '.join(differ)}: " + "; ".join(
                    f"{a.replica} of {mid}: " + ", ".join(
                        f"{k}={a.body.get(k)!r}" for k in differ if isinstance(a.body, dict))
                    for mid, a in answers), replicas=replicas)
        return {**merged, "replicas": replicas}

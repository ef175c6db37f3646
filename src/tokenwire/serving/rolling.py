"""Rolling updates: new weights for a fleet a few replicas at a time, the rest serving.

For each batch of `max_unavailable` replicas that do not yet report the target version: hold
them out of routing, pause them (`wait`: what runs there finishes), run the client's update
calls on them (vLLM's own: `collective_rpc` `reload_weights`, `update_weights`...), label the
weights, reset the prefix cache, read the label back, resume them and route to them again. A
request meanwhile goes to a replica that serves; its samples name the weights that made them.

A failure stops the roll where it is. A call the replicas refused (a 4xx: a bad path, a bad
body) changed nothing, so that batch resumes with its old weights; any other failure (a 5xx, a
replica unreachable, a label that did not take) leaves the batch paused and out of routing
(its weights are whatever the failed call left: never served under a label). The 502 says
which replica holds which version. The same call again resumes the roll: replicas that report
the target version are skipped (but not a batch a stopped roll left held, whatever it
reports), so only the rest is redone. One roll at a time on a box (a file lock every worker
takes); a paused fleet (the trainer's pause) is refused rather than resumed behind the
trainer's back. Plain control calls are not locked out meanwhile: a fleet-wide `/resume` in
the middle of a roll resumes the batch being updated too.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..engines.base import ControlAnswer, ControlCall, Engine
from ..engines.upstream.board import MAX_LABEL, RUN_DIR_ENV
from ..errors import (
    InvalidRequestError,
    ReplicaControlError,
    RollingUpdateError,
    TokenwireError,
    UnsupportedParameterError,
)
from ..protocol.control import RollingUpdateBody
from .models import ModelRegistry, ServedModel

__all__ = ["RollingUpdates"]

log = logging.getLogger(__name__)


@dataclass
class _Replica:
    model: str
    name: str
    version: str | None
    state: str = "pending"
    """current (already at the target), updated, failed, held (in the failed batch), pending"""
    answer: ControlAnswer | None = None

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "replica": self.name,
                               "weight_version": self.version, "state": self.state}
        if self.answer is not None and not self.answer.ok:
            out.update(status=self.answer.status, body=self.answer.body)
        return out


class _Stopped(Exception):
    """A call failed on some replica of the batch."""

    def __init__(self, op: str, answers: list[ControlAnswer], why: str):
        super().__init__(f"{op}: {why}")
        self.op = op
        self.answers = answers


class RollingUpdates:
    def __init__(self, models: ModelRegistry):
        self._models = models
        self._lock = asyncio.Lock()

    async def run(self, body: RollingUpdateBody) -> dict[str, Any]:
        if len(body.weight_version.encode()) > MAX_LABEL:
            raise InvalidRequestError(f"a weight version label is at most {MAX_LABEL} bytes "
                                      "(UTF-8)", param="weight_version")
        if self._lock.locked():
            raise _busy()
        async with self._lock:
            with _one_roll_per_box():
                started = time.monotonic()
                reports: list[_Replica] = []
                for m in self._models.all():
                    reports += await self._model(m, body, reports)
                return {"weight_version": body.weight_version,
                        "seconds": round(time.monotonic() - started, 3),
                        "replicas": [r.report() for r in reports]}

    async def _model(self, m: ServedModel, body: RollingUpdateBody,
                     earlier: list[_Replica]) -> list[_Replica]:
        engine = m.engine
        if not engine.info.control_plane:
            raise UnsupportedParameterError(
                f"model {m.id!r}: its engine has no control plane (rolling_update)",
                param="rolling_update")
        info = await engine.control(ControlCall("weight_info"))
        reps = [_Replica(m.id, a.replica, a.body.get("weight_version")
                         if a.ok and isinstance(a.body, dict) else None, answer=a)
                for a in info]
        if any(not a.ok for a in info):
            for r in reps:
                r.state = "failed" if r.answer is not None and not r.answer.ok else "pending"
            raise self._error(m, "weight_info", "could not read every replica's version: "
                              "nothing was changed", earlier + reps)
        left = engine.held()  # a stopped roll's batch: redone, whatever it reports
        await self._refuse_paused(m, engine, left)
        for r in reps:
            r.answer = None
            if r.version == body.weight_version and r.name not in left:
                r.state = "current"
        todo = [r for r in reps if r.state == "pending"]
        k = body.max_unavailable
        for i in range(0, len(todo), k):
            batch = todo[i:i + k]
            try:
                await self._update(engine, batch, body)
            except _Stopped as exc:
                held = engine.held()
                for r in batch:
                    r.state = "held" if r.name in held else "pending"
                for a in exc.answers:
                    r = next(x for x in batch if x.name == a.replica)
                    r.answer, r.state = a, "failed"
                raise self._error(m, exc.op, str(exc), earlier + reps) from None
            for r in batch:
                r.state, r.version = "updated", body.weight_version
        return reps

    async def _refuse_paused(self, m: ServedModel, engine: Engine,
                             left: frozenset[str]) -> None:
        """A fleet the trainer paused is not resumed by a roll."""
        if engine.paused is not None:  # a gateway remembers it (SGLang cannot say)
            raise _paused(m)
        try:
            answers = await engine.control(ControlCall("is_paused"))
        except UnsupportedParameterError:
            return
        paused = [a.replica for a in answers if a.ok and isinstance(a.body, dict)
                  and a.body.get("is_paused") and a.replica not in left]
        if paused and len(paused) == len(answers):
            raise _paused(m)

    async def _update(self, engine: Engine, batch: list[_Replica],
                      body: RollingUpdateBody) -> None:
        """One batch through the calls. A call refused before the batch was paused changes
        nothing (the batch goes back into routing, the refusal is the answer); any later
        failure leaves it held and paused (`_Stopped`, or the error as it came)."""
        names = tuple(r.name for r in batch)
        calls = [ControlCall("pause", (("mode", body.pause_mode),)),
                 *(ControlCall(s.op, tuple(s.query.items()), s.body) for s in body.calls),
                 ControlCall("update_weight_version", body={"new_version": body.weight_version}),
                 ControlCall("reset_prefix_cache"), ControlCall("weight_info"),
                 ControlCall("resume")]
        log.info("rolling update to %r: %s", body.weight_version, ", ".join(names))
        engine.hold(names, True)
        for n, call in enumerate(calls):
            try:
                answers = await engine.control(replace(call, replicas=names))
            except TokenwireError as exc:
                if n == 0:  # the pause itself was refused (SGLang has no draining pause)
                    engine.hold(names, False)
                    raise
                # refused after the pause: the batch stays held, and the answer says so
                raise _Stopped(call.op, [ControlAnswer(x, exc.status_code, exc.to_body())
                                         for x in names], str(exc)) from None
            failed = [a for a in answers if not a.ok]
            if call.op == "reset_prefix_cache":  # vLLM answers 200 with success false
                failed += [a for a in answers if a.ok and isinstance(a.body, dict)
                           and a.body.get("success") is False]
            if call.op == "weight_info":
                failed += [a for a in answers if a.ok and (not isinstance(a.body, dict) or
                           a.body.get("weight_version") != body.weight_version)]
            if failed:
                why = "; ".join(f"{a.replica} answered {a.status}: {str(a.body)[:200]}"
                                for a in failed)
                if all(400 <= a.status < 500 for a in failed) and call.op not in (
                        "update_weight_version", "weight_info"):
                    # refused (a bad path, a bad body): nothing changed there, so the batch
                    # serves its old weights again; the roll still stops
                    await self._back(engine, names)
                    why += " (refused: the batch serves its old weights again)"
                raise _Stopped(call.op, failed, why)
        engine.hold(names, False)

    @staticmethod
    async def _back(engine: Engine, names: tuple[str, ...]) -> None:
        answers = await engine.control(ControlCall("resume", replicas=names))
        if all(a.ok for a in answers):
            engine.hold(names, False)

    @staticmethod
    def _error(m: ServedModel, op: str, why: str,
               reps: list[_Replica]) -> ReplicaControlError:
        held = ", ".join(f"{r.name}: {r.version!r} ({r.state})" for r in reps)
        return ReplicaControlError(
            f"the rolling update of {m.id!r} stopped at {op}: {why}. The replicas now: {held}. "
            "The replicas left paused are out of routing; the same call again resumes the "
            "roll", replicas=[r.report() for r in reps])


def _busy() -> RollingUpdateError:
    return RollingUpdateError("a rolling update is running on this server: wait for its "
                              "answer (one roll at a time)")


def _paused(m: ServedModel) -> RollingUpdateError:
    return RollingUpdateError(
        f"model {m.id!r}: the fleet is paused (a control call paused it): resume it first, or "
        "update it with the plain control calls", code="fleet_paused")


@contextlib.contextmanager
def _one_roll_per_box() -> Iterator[None]:
    """One roll at a time on the box: every worker of a server takes the same file lock (in
    the run directory its supervisor made; one worker: the caller's lock is enough)."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        yield
        return
    fd = os.open(Path(run_dir) / "rolling.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy() from None
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)

"""The control plane of an upstream engine: one call for the whole fleet.

An RL trainer pauses the fleet, pushes new weights, labels them with a version, resets the
prefix cache and resumes; it should not have to know every replica's address to do so. Each
call (`CONTROL_OPS`: vLLM's RL and dev endpoints) goes to every replica of the engine at once,
spelled by the protocol module (`control_request`: vLLM's own paths; engines without a control
plane refuse by name), and every replica's answer comes back: a partial failure is the caller's
to see, never hidden.

The fleet's state is remembered from the calls that succeeded (paused and how, the weight
version), so a replica that joins later (restarted, recovered) is brought to it before it
serves: paused if the fleet is; and if the fleet's weights carry a version, kept out until its
own `/weight_info` says the same version (its weights came from disk, not from the trainer: a
replica serving other weights under the fleet's label would mix versions silently). Control
calls still reach a replica kept out, so the trainer's next push brings it in.

What each replica serves and whether it is paused is what it reports: every health check reads
its `/weight_info` and `/is_paused` (and every control answer updates them), so a box routes by
the replicas' own state even when another box pushed the weights (versions.py orders them).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol
from urllib.parse import urlencode

from ...errors import InvalidRequestError, UnsupportedParameterError
from ..base import ControlAnswer, ControlCall
from ..versions import VersionOrder
from .board import MAX_LABEL, Board
from .replica import Replica
from .transport import TRANSPORT_ERRORS

__all__ = ["FleetControl"]

OBSERVE_TIMEOUT = 5.0
"""Seconds one reading of a replica's state (`/weight_info`, `/is_paused`, its adapters) may
take: a replica that hangs there must not hold back requests waiting for a version."""

log = logging.getLogger(__name__)


class _Owner(Protocol):
    """What the fleet's control needs of its engine (engine.py's `UpstreamEngine`, which
    imports this module)."""

    @property
    def board(self) -> Board: ...
    @property
    def replicas(self) -> list[Replica]: ...
    def control_request(self, call: ControlCall) -> tuple[str, str, Any]: ...
    def control_answer(self, call: ControlCall, status: int, body: Any) -> tuple[int, Any]: ...
    async def call(self, replica: Replica, method: str, path: str, body: Any = None,
                   ) -> tuple[int, Any]: ...
    async def adapters_of(self, replica: Replica) -> dict[str, str] | None: ...


class FleetControl:
    """One engine's control calls, and the state of its fleet they set."""

    def __init__(self, engine: _Owner):
        self._engine = engine
        self._board = engine.board  # every worker of the box remembers the same state
        self.order = VersionOrder()
        self._adapter_orders: dict[str, VersionOrder] = {}
        self._reports: dict[str, bool] = {}
        """Which of weight_info / is_paused the protocol has (False: refused by name)."""
        self._refreshing: asyncio.Future[Any] | None = None

    @property
    def paused(self) -> str | None:
        """How the fleet was paused (vLLM's mode: abort, wait, keep); None: it serves."""
        return self._board.paused

    @property
    def weight_version(self) -> str | None:
        """The version the fleet's weights were labelled with last (None: never labelled)."""
        return self._board.weight_version

    @property
    def reports_versions(self) -> bool | None:
        """Whether the replicas report their weights' version (None: not asked yet)."""
        return self._reports.get("weight_info")

    def order_of(self, adapter: str | None) -> VersionOrder:
        """The order of the base weights' versions, or of one adapter's."""
        if adapter is None:
            return self.order
        return self._adapter_orders.setdefault(adapter, VersionOrder())

    async def call(self, call: ControlCall) -> list[ControlAnswer]:
        """`call` on every replica at once; each replica's answer, in replica order."""
        if call.op == "load_lora_adapter" and call.replicas is None:
            return await self._load_adapter(call)
        label = self._label(call)
        if label is not None and len(label[1].encode()) > MAX_LABEL:
            raise InvalidRequestError(f"a weight version label is at most {MAX_LABEL} bytes "
                                      "(UTF-8)", param=label[0])
        method, path, body = self._engine.control_request(call)
        query = f"?{urlencode(call.query)}" if call.query and "?" not in path else ""
        reached = [r for r in self._engine.replicas
                   if call.replicas is None or r.name in call.replicas]
        if label is not None:
            self.order.see([label[1]])  # the order the fleet is given versions in
        answers = await asyncio.gather(*(self._one(r, call, method, path + query, body)
                                         for r in reached))
        for r, a in zip(reached, answers, strict=True):
            if a.ok:
                self._learn(r, call, a.body)
        self.place()
        if any(a.ok for a in answers) and call.replicas is None:
            self._remember(call)
        elif label is not None and all(r.weight_version == label[1]
                                       for r in self._engine.replicas):
            self._board.weight_version = label[1]  # a rolling update's last batch
        return list(answers)

    def _learn(self, r: Replica, call: ControlCall, body: Any) -> None:
        """What a replica's answer to `call` says of its state."""
        label = self._label(call)
        if label is not None:
            r.weight_version = label[1]
        elif call.op == "weight_info" and isinstance(body, dict):
            r.weight_version = body.get("weight_version")  # placed by `place` (a sweep)
        elif call.op == "pause":
            r.paused = True
        elif call.op == "resume":
            r.paused = False
        elif call.op == "is_paused" and isinstance(body, dict):
            r.paused = bool(body.get("is_paused"))
        elif call.op == "load_lora_adapter" and isinstance(call.body, dict):
            name, path = call.body.get("lora_name"), call.body.get("lora_path")
            if isinstance(name, str) and isinstance(path, str):
                self.order_of(name).see([path])
                r.adapters[name] = (path, path)
        elif call.op == "unload_lora_adapter" and isinstance(call.body, dict):
            r.adapters.pop(str(call.body.get("lora_name")), None)

    def _see_adapters(self, r: Replica, served: dict[str, str]) -> None:
        """A replica's adapters as it reports them (name: path). An adapter's version is its
        path: what every replica reports, so every worker and box names it alike."""
        r.adapters = {name: (path, path) for name, path in served.items()}
        for name, path in served.items():
            self.order_of(name).see([path])

    def place(self) -> None:
        """Place the versions the replicas report that this box has not met, together (in
        natural order among themselves: a box started in the middle of a roll meets two)."""
        self.order.see([r.weight_version for r in self._engine.replicas])

    async def observe(self, r: Replica) -> None:
        """Read a replica's version and pause state from the replica itself."""
        for op in ("weight_info", "is_paused"):
            if self._reports.get(op) is False:
                continue
            call = ControlCall(op)
            try:
                status, data = await asyncio.wait_for(self._ask(r, call), OBSERVE_TIMEOUT)
            except UnsupportedParameterError:  # the protocol has no such call
                self._reports[op] = False
                continue
            if status == 200:
                self._reports[op] = True
                self._learn(r, call, data)
        await self._observe_adapters(r)

    async def _observe_adapters(self, r: Replica) -> None:
        if self._reports.get("adapters") is False:
            return
        served = await asyncio.wait_for(self._engine.adapters_of(r), OBSERVE_TIMEOUT)
        self._reports["adapters"] = served is not None
        if served is not None:
            self._see_adapters(r, served)

    async def _load_adapter(self, call: ControlCall) -> list[ControlAnswer]:
        """Load an adapter on every replica; where one of that name serves (a replacement),
        each such replica in turn is held out of routing and drained (`pause?mode=wait`)
        first, so that no sample is made partly by the old weights and partly by the new. The
        first replica that fails stops the replacement there (the rest are not reached)."""
        body = call.body if isinstance(call.body, dict) else {}
        name, path = str(body.get("lora_name")), str(body.get("lora_path"))
        reps = self._engine.replicas
        # what each replica serves now, read from it (another worker or box may have loaded)
        await asyncio.gather(*(self._observe_adapters(r) for r in reps if r.healthy),
                             return_exceptions=True)
        holding = [r for r in reps if name in r.adapters]
        if holding and not body.get("load_inplace"):
            raise InvalidRequestError(
                f"an adapter named {name!r} is loaded already: replace it with load_inplace "
                "true (each replica is drained first)", param="lora_name")
        if any(r.adapters[name][0] == path for r in holding):
            raise InvalidRequestError(
                f"adapter {name!r} was loaded from {path!r} already: load the new weights from "
                "a new path (an adapter's version is its path; vLLM keys its cached prefixes "
                "by name and path, so the same path would reuse KV of the old weights)",
                param="lora_path")
        if holding and self.paused == "keep":
            raise InvalidRequestError(
                "the fleet is paused with mode keep: an adapter replaced now would go on "
                "sampling the frozen sequences unseen; resume first", param="load_inplace")
        fresh = [r for r in reps if r not in holding]
        answers = dict(zip(fresh, await asyncio.gather(*(self._direct(r, call) for r in fresh)),
                           strict=True))
        failed = False
        for r in holding:
            answers[r] = ControlAnswer(r.name, 409, {"error": "not reached: the replacement "
                                                     "failed on an earlier replica"}) \
                if failed else await self._drained(r, call)
            failed = failed or not answers[r].ok
        return [answers[r] for r in reps]

    async def _direct(self, r: Replica, call: ControlCall) -> ControlAnswer:
        method, path, body = self._engine.control_request(call)
        query = f"?{urlencode(call.query)}" if call.query and "?" not in path else ""
        answer = await self._one(r, call, method, path + query, body)
        if answer.ok:
            self._learn(r, call, answer.body)
        return answer

    async def _drained(self, r: Replica, call: ControlCall) -> ControlAnswer:
        """`call` on one replica held out of routing and paused (draining) meanwhile, then
        resumed and routed to again; also when the call failed there (vLLM keeps the adapter it
        had when a load fails). Left paused only if it cannot be resumed."""
        self._board.hold(r.index, True)
        pause = self.paused is None  # a paused fleet runs nothing: no drain, no resume
        try:
            if pause:
                paused = await self._direct(r, ControlCall("pause", (("mode", "wait"),)))
                if not paused.ok:
                    return paused
            answer = await self._direct(r, call)
            if pause:
                resumed = await self._direct(r, ControlCall("resume"))
                if not resumed.ok:
                    return resumed
            return answer
        finally:  # routed again; a replica still paused is passed over while others serve
            self._board.hold(r.index, False)

    async def refresh(self) -> None:
        """Every healthy replica's version and pause state, read now (requests waiting
        together share one reading)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._sweep())
        await asyncio.shield(self._refreshing)

    async def _sweep(self) -> None:
        await asyncio.gather(*(self.observe(r) for r in self._engine.replicas if r.healthy),
                             return_exceptions=True)
        self.place()

    async def _one(self, r: Replica, call: ControlCall, method: str, path: str,
                   body: Any) -> ControlAnswer:
        try:
            status, data = await self._engine.call(r, method, path, body)
        except TRANSPORT_ERRORS as exc:
            return ControlAnswer(r.name, 503, {"error": f"unreachable: {exc!r}"})
        return ControlAnswer(r.name, *self._engine.control_answer(call, status, data))

    async def _ask(self, r: Replica, call: ControlCall) -> tuple[int, Any]:
        """`call` on one replica, in the protocol's terms, answered in vLLM's."""
        method, path, body = self._engine.control_request(call)
        status, data = await self._engine.call(r, method, path, body)
        return self._engine.control_answer(call, status, data)

    @staticmethod
    def _label(call: ControlCall) -> tuple[str, str] | None:
        """The weight version `call` labels the fleet's weights with (its body's key), if any."""
        body = call.body if isinstance(call.body, dict) else {}
        key = {"update_weight_version": "new_version",
               "finish_weight_update": "weight_version"}.get(call.op)
        return (key, body[key]) if key and isinstance(body.get(key), str) else None

    def _remember(self, call: ControlCall) -> None:
        label = self._label(call)
        if call.op == "pause":
            mode = dict(call.query).get("mode", "abort")
            self._board.paused = mode if mode in ("abort", "wait", "keep") else "abort"
        elif call.op == "resume":  # the whole fleet serves: a stopped roll's hold ends too
            self._board.paused = None
            for r in self._engine.replicas:
                self._board.hold(r.index, False)
        elif label is not None:
            self._board.weight_version = label[1]

    async def join(self, r: Replica) -> str | None:
        """Bring a replica that is about to serve to the fleet's state; why it cannot serve
        yet, or None."""
        if self.weight_version is not None:
            status, data = await self._ask(r, ControlCall("weight_info"))
            theirs = data.get("weight_version") if isinstance(data, dict) else None
            if status != 200 or theirs != self.weight_version:
                return (f"it serves weights labelled {theirs!r}, the fleet "
                        f"{self.weight_version!r}: push the fleet's weights to it (the "
                        "control plane's weight calls reach it)")
        if self.paused is not None:
            # nothing is in flight there yet: any mode pauses it the same
            status, _ = await self._ask(r, ControlCall("pause", (("mode", "abort"),)))
            if status != 200:
                return f"the fleet is paused, and it answered {status} to /pause"
            log.info("upstream %s joins a paused fleet: paused", r.url)
        return None

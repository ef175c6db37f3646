"""The control plane on the engine: pause, new weights (a GGUF, LoRA adapters) and their
version label, run on the worker thread between two decodes (rl_endpoints.py maps vLLM's
RL endpoints onto these)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from ...errors import (
    InvalidRequestError,
    ServiceUnavailableError,
)
from ..base import (
    ControlAnswer,
    ControlCall,
)
from ..versions import WeightBound
from .model import (
    LoraError,
)
from .rl_endpoints import REPLICA, PauseMode, answer, content_version
from .slots import Slots
from .state import EngineState

log = logging.getLogger(__name__)


class ControlPlane(EngineState):
    """What vLLM's RL endpoints do to the embedded engine."""

    async def control(self, call: ControlCall) -> list[ControlAnswer]:
        """vLLM's RL endpoints, answered by this engine (rl_endpoints.py); one replica: nothing
        to hold (a paused engine queues requests until it resumes)."""
        return [await answer(self, call)]

    async def on_worker(self, job: Callable[[], object]) -> object:
        """Run `job` on the worker thread between two decodes; its result."""
        done: concurrent.futures.Future[object] = concurrent.futures.Future()
        with self._cv:
            if self._stopping or self._thread is None or not self._thread.is_alive():
                raise ServiceUnavailableError("the engine is not running")
            self._jobs.append((job, done))
            self._cv.notify()
        return await asyncio.wrap_future(done)

    @property
    def paused(self) -> PauseMode | None:
        return self._paused

    @property
    def weight_version(self) -> str:
        return self._version

    async def _within_bound(self, bound: WeightBound | None) -> None:
        """Wait (up to the bound's wait) until the weights satisfy `bound`. Alone, they are
        the newest (any `max_staleness` holds); `min_weight_version` holds once they carried
        that label (it, or a later one, serves)."""
        if bound is None or bound.min_version is None:
            return
        deadline = time.monotonic() + bound.wait
        while self._order.rank(bound.min_version) is None:
            if time.monotonic() >= deadline:
                raise self._order.unavailable(bound, [(REPLICA, self._label, "paused"
                                                       if self._paused else "serving")])
            await asyncio.sleep(0.05)

    def control_state(self) -> dict[str, object]:
        """What the control plane has set (the engine process keeps it across a restart)."""
        return {"weights": str(self._weights), "base_version": self._base_version,
                "adapters": [[str(p), s] for p, s in self._adapters],
                "version": self._version, "paused": self._paused}

    async def pause(self, mode: PauseMode) -> None:
        """vLLM's pause: `abort` ends every sequence now (finish reason "abort"), `wait` lets
        them run to their end and returns then, `keep` freezes them where they stand until
        `resume`. Sequences that arrive while paused wait for `resume`."""
        def job() -> concurrent.futures.Future[None] | None:
            with self._cv:
                self._paused = mode
                if mode == "abort":
                    self._abort_all()
                if mode != "wait":
                    return None
                self._draining = {*self._active, *self._waiting}
                self._drained = concurrent.futures.Future()
                self._check_drained()
                return self._drained
        drained = await self.on_worker(job)
        if isinstance(drained, concurrent.futures.Future):
            await asyncio.wrap_future(drained)

    def _abort_all(self) -> None:
        for seq in list(self._active):
            self._release(seq)
            seq.emit(self._finish(seq, "abort"))
        waiting, self._waiting = list(self._waiting), deque()
        for seq in waiting:
            seq.done = True
            seq.emit(self._finish(seq, "abort"))

    async def resume(self) -> None:
        def job() -> None:
            with self._cv:
                self._paused = None
                self._draining = set()
                self._check_drained()
        await self.on_worker(job)

    async def set_weight_version(self, version: str) -> None:
        """Label the weights: every token sampled from now on carries `version`."""
        def job() -> None:
            self._version = version
        await self.on_worker(job)

    async def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (running sequences keep their own KV)."""
        def job() -> None:
            with self._cv:
                self._new_generation()
        await self.on_worker(job)

    def _new_generation(self) -> None:
        """From now on no KV computed before is reused by another prompt (under the lock)."""
        self._gen += 1
        for slot in self._slots.clear():
            self.llama.forget(slot)

    async def load_weights(self, path: Path, version: str | None = None) -> str:
        """Serve the weights of another GGUF of the same vocabulary, with no restart; its
        version (`version`, default its content hash). Refused while `pause?mode=keep` holds
        sequences (their KV lives in the old model's context)."""
        fresh = await asyncio.to_thread(self._new_model, path)
        label: str = version if version else await asyncio.to_thread(content_version, path)

        def job() -> str:
            with self._cv:
                held = len(self._active) + len(self._waiting)
            if self._active:
                raise InvalidRequestError(
                    f"{len(self._active)} sequences are running or frozen by pause?mode=keep: "
                    "new GGUF weights start with an empty KV cache; pause with mode=abort or "
                    "mode=wait first", param="weights_path")
            why = self.llama.same_vocabulary(fresh)
            if why is not None:
                raise InvalidRequestError(
                    f"{path.name} has another vocabulary ({why}): the served tokenizer "
                    "version would no longer describe it", param="weights_path")
            with self._model_lock:
                old, self._llama = self._llama, fresh
                warm = self._guides is not None and self._guides.built
                self._guides = self._new_guides(fresh)
            assert old is not None
            old.close()
            if warm:  # grammars in use: index the vocabulary now, not in the next admission
                self._guides.warm()
            with self._cv:
                self._slots = Slots(self._n_parallel)
                self._gen += 1
                self._version = self._base_version = label
                self._weights, self._adapters = path, []
            log.info("new weights from %s (version %s; %d sequences waiting)", path, label,
                     held)
            return label
        try:
            return str(await self.on_worker(job))
        except BaseException:
            if fresh is not self._llama:
                fresh.close()
            raise

    async def load_lora(self, adapters: Sequence[tuple[Path, float]],
                        version: str | None = None) -> str:
        """Serve the model with these LoRA adapters (GGUF, with scales; none: the bare
        model) from the next decode on; its version (`version`, default the model's with the
        adapters' content hashes)."""
        label = version or "+".join([self._base_version, *[
            f"lora:{await asyncio.to_thread(content_version, p)}@{scale:g}"
            for p, scale in adapters]])

        def job() -> str:
            try:
                self.llama.set_lora(adapters)
            except LoraError as exc:
                raise InvalidRequestError(str(exc), param="lora_path") from exc
            with self._cv:
                self._new_generation()
                self._version = label
                self._adapters = list(adapters)
            return label
        return str(await self.on_worker(job))

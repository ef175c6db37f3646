"""`LlamaCppEngine`: the embedded engine whole: start, admission from the async side, and the
worker thread's loop."""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from collections import deque
from collections.abc import Callable, Sequence

from ...errors import (
    InvalidRequestError,
    RateLimitError,
    ServiceUnavailableError,
    UnsupportedParameterError,
)
from ...tokenizers.probe import TokenizerParityError, first_mismatch
from .._events import QueuedEvents
from ..base import (
    EngineEvent,
    EngineHealth,
    EngineInfo,
    Grammar,
    SamplingParams,
    check_prompt,
)
from ..grammars.guide import GuideError
from .control_plane import ControlPlane
from .decode import Decoding
from .kv_reuse import KvReuse
from .model import (
    Batch,
    Sampler,
)
from .rl_endpoints import content_version
from .state import Seq, failed

log = logging.getLogger(__name__)


class _EventStream(QueuedEvents):
    """The events of one sequence, queued by the engine's thread."""

    def __init__(self, engine: LlamaCppEngine, seq: Seq):
        super().__init__()
        self._engine = engine
        self._seq = seq

    def _cancel(self) -> None:
        self._engine._cancel(self._seq)


class LlamaCppEngine(ControlPlane, Decoding, KvReuse):
    """Implements `Engine` for a GGUF model, decoding up to `n_parallel` sequences together.
    Its parts: `EngineState` (state.py), `KvReuse`, `Decoding`, `ControlPlane`."""

    def load(self) -> None:
        """Load the model (blocking); `start` does it in a thread."""
        if self._llama is not None:
            return
        self._llama = self._new_model(self._path)
        self._guides = self._new_guides(self._llama)
        self._version = self._base_version = content_version(self._path)
        self._info = EngineInfo(
            model=self._model_id,
            max_model_len=self._llama.n_ctx_seq,
            vocab_size=self._llama.n_vocab,
            eog_ids=self._llama.eog_ids(),
            max_sequences=self._n_parallel + self._max_queued,
            logprobs_mode=self._logprobs_mode,
            control_plane=True,
            sampling_mask=self._sampling_mask,
            grammar_after_reasoning=True,
        )

    def _compile(self, grammar: Grammar) -> None:
        """Compile (or find compiled) a request's grammar: a 400 naming the field if it cannot
        be enforced."""
        try:
            with self._model_lock:
                assert self._guides is not None
                self._guides.compile(grammar)
        except GuideError as exc:
            raise (UnsupportedParameterError(str(exc), param=exc.param) if exc.unsupported
                   else InvalidRequestError(str(exc), param=exc.param,
                                            code="invalid_grammar")) from exc

    async def start(self) -> None:
        if self._thread is not None:
            return
        await asyncio.to_thread(self.load)
        if self._tokenizer is not None:
            llama = self.llama

            async def reference(texts: Sequence[str]) -> list[list[int]]:
                return [llama.tokenize(t, parse_special=True) for t in texts]

            miss = await first_mismatch(self._tokenizer, reference)
            if miss is not None:
                self._llama = None
                llama.close()
                raise TokenizerParityError(miss.describe(f"llama.cpp ({self._path.name})"))
        self._stopping = False
        self._died = None
        self._thread = threading.Thread(target=self._run, name="llamacpp-engine", daemon=True)
        self._thread.start()

    async def aclose(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        if self._llama is not None:
            self._llama.close()
            self._llama = None

    def health(self) -> EngineHealth:
        thread = self._thread
        if thread is None or not thread.is_alive() or self._stopping:
            return EngineHealth(ok=False,
                                reason=self._died or "the embedded engine is not running")
        return EngineHealth(ok=True)

    @property
    def n_active(self) -> int:
        """Sequences holding a slot now."""
        return len(self._active)

    @property
    def n_waiting(self) -> int:
        """Sequences waiting for a slot."""
        return len(self._waiting)

    async def submit(self, prompt: Sequence[int], params: SamplingParams) -> _EventStream:
        """Admit a sequence now (raising if the engine is down or its queue is full)."""
        await self.prepare(prompt, params)
        loop = asyncio.get_running_loop()
        seq = Seq(prompt=list(prompt), params=params, emit=lambda ev: None)
        stream = _EventStream(self, seq)
        put = stream.queue.put_nowait

        def emit(ev: EngineEvent | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(put, ev)
            except RuntimeError:  # the consumer's event loop is gone: nobody is listening
                seq.cancelled = True

        seq.emit = emit
        try:
            self._enqueue(seq)
        except BaseException:
            stream.done = True  # never queued: nothing to cancel
            raise
        return stream

    async def prepare(self, prompt: Sequence[int], params: SamplingParams) -> None:
        """What admission checks before queueing: the prompt, and the grammar compiled."""
        check_prompt(prompt, self.info)
        await self._within_bound(params.weight_bound)
        if params.grammar is not None:  # off the loop: the first builds the vocabulary's index
            await asyncio.to_thread(self._compile, params.grammar)

    def admit(self, prompt: Sequence[int], params: SamplingParams,
              emit: Callable[[EngineEvent | BaseException], None]) -> Callable[[], None]:
        """Queue a prepared sequence whose events go to `emit`, called on the worker thread
        (the engine process batches them onto its connection); returns its cancel."""
        seq = Seq(prompt=list(prompt), params=params, emit=emit)
        self._enqueue(seq)
        return lambda: self._cancel(seq)

    def _enqueue(self, seq: Seq) -> None:
        with self._cv:
            if self._stopping or self._thread is None or not self._thread.is_alive():
                raise ServiceUnavailableError("the engine is not running")
            # sequences beyond the free slots wait; at most max_queued of them
            if len(self._waiting) - len(self._slots.free) >= self._max_queued:
                raise RateLimitError("too many requests are waiting for the engine")
            self._waiting.append(seq)
            self._cv.notify()

    def _cancel(self, seq: Seq) -> None:
        with self._cv:
            if not seq.done:
                seq.cancelled = True
                self._cv.notify()

    def _has_work(self) -> bool:
        """Whether the worker has something to do now (under the lock)."""
        if self._stopping or self._jobs:
            return True
        if any(s.cancelled for s in self._active) or any(s.cancelled for s in self._waiting):
            return True
        if self._paused is None:
            return bool(self._active or self._waiting)
        if self._paused == "wait":
            return bool(self._active) or any(s in self._draining for s in self._waiting)
        return False  # abort, keep: nothing runs until resumed

    def _admissible(self, seq: Seq) -> bool:
        return self._paused is None or (self._paused == "wait" and seq in self._draining)

    def _run(self) -> None:
        batch = Batch(self._n_batch)
        try:
            while True:
                with self._cv:
                    while not self._has_work():
                        self._cv.wait()
                    if self._stopping:
                        break
                    jobs, self._jobs = list(self._jobs), deque()
                for job, done in jobs:
                    try:
                        done.set_result(job())
                    except Exception as exc:  # noqa: BLE001 - the caller's to raise
                        done.set_exception(exc)
                with self._cv:
                    for seq in [s for s in self._active if s.cancelled]:
                        self._release(seq)
                    if any(s.cancelled for s in self._waiting):
                        for s in self._waiting:
                            s.done = s.done or s.cancelled
                        self._waiting = deque(s for s in self._waiting if not s.cancelled)
                    while self._waiting and self._slots.free \
                            and self._admissible(self._waiting[0]):
                        seq = self._waiting[0]  # still queued if placing it fails: it is told
                        self._place(seq)
                        self._waiting.popleft()
                        self._admit(seq)
                    for seq in self._active:
                        if seq.leader is not None:
                            self._catch_up(seq)
                    self._check_drained()
                    frozen = self._paused in ("keep", "abort")
                if not self._active or frozen:
                    continue
                try:
                    self._step(self.llama, batch)
                except Exception as exc:  # noqa: BLE001 - the engine must outlive one bad step
                    log.exception("engine step failed")
                    with self._cv:
                        for seq in list(self._active):
                            self._release(seq, keep=False)  # free, then tell
                            seq.emit(failed(f"the engine failed: {exc}", exc))
        except Exception as exc:  # noqa: BLE001 - the loop itself failed: say so in /health
            log.exception("the embedded engine's worker stopped")
            self._died = f"the embedded engine's worker stopped: {exc!r}"
        finally:
            with self._cv:
                self._stopping = True  # also when the loop died: refuse new work from now on
                for seq in list(self._active):
                    self._release(seq, keep=False)  # sampler and slot freed
                    seq.emit(ServiceUnavailableError("the engine shut down"))
                waiting, self._waiting = list(self._waiting), deque()
                for seq in waiting:  # out of the queue first, then told
                    seq.done = True
                    seq.emit(ServiceUnavailableError("the engine shut down"))
                jobs, self._jobs = list(self._jobs), deque()
            for _, done in jobs:
                done.set_exception(ServiceUnavailableError("the engine shut down"))
            if self._drained is not None and not self._drained.done():
                self._drained.set_result(None)
            batch.free()

    def _admit(self, seq: Seq) -> None:
        llama = self.llama
        p = seq.params
        seq.stops = p.stops(self.info.eog_ids)
        seq.gen = self._gen
        try:
            seq.sampler = Sampler(
                llama,
                temperature=p.temperature,
                top_p=p.top_p,
                seed=p.seed if p.seed is not None else secrets.randbits(32),
                presence_penalty=p.presence_penalty,
                frequency_penalty=p.frequency_penalty,
                window=p.max_tokens,
                top_k=p.top_k,
                min_p=p.min_p,
                repetition_penalty=p.repetition_penalty,
                prompt=seq.prompt,
                logit_bias=p.logit_bias,
            )
            if p.grammar is not None:  # compiled at admission: found in the cache
                assert self._guides is not None
                seq.guide = self._guides.start(p.grammar)
        except GuideError as exc:  # it compiled at submit: a bug, not the client's
            self._release(seq, keep=False)
            seq.emit(failed(str(exc), exc))
            return
        self._active.append(seq)

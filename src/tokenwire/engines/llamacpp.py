"""The embedded engine: llama.cpp through llama-cpp-python's low-level API.

One worker thread owns the model. Each loop turn it admits waiting requests into free sequence
slots, packs one `llama_batch` with the next token of every decoding sequence plus a chunk of
pending prompt tokens, runs a single `llama_decode` for all of them, and samples each sequence
with its own C-side sampler chain. Events cross to the asyncio side through
`loop.call_soon_threadsafe`, so model compute never blocks the event loop. A consumer that stops
iterating marks its sequence cancelled; the worker frees the slot before the next decode.

The control plane (vLLM's RL endpoints, `_llama_control.py`) runs on the worker thread too, between
two decodes: pausing (abort, drain, or freeze the batch), new weights (a GGUF, LoRA adapters)
and their version label, which every sampled token is stamped with (`weight_versions`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from ..config import default_model_name
from ..errors import (
    EngineError,
    InvalidRequestError,
    RateLimitError,
    ServiceUnavailableError,
    UnsupportedParameterError,
)
from ..tokenizers.hf import HFTokenizer
from ..tokenizers.probe import TokenizerParityError, first_mismatch
from ._events import QueuedEvents
from ._llama import (
    Batch,
    LlamaModel,
    LoraError,
    Sampler,
    log_softmax,
)
from ._llama_control import REPLICA, PauseMode, answer, content_version
from ._slots import MIN_COPY, Slots, common_prefix
from .base import (
    LOGPROB_FLOOR,
    ControlAnswer,
    ControlCall,
    EngineBase,
    EngineEvent,
    EngineHealth,
    EngineInfo,
    FinishEvent,
    Grammar,
    PromptLogprobsEvent,
    SamplingParams,
    TokenEvent,
    WeightSpan,
    check_prompt,
)
from .grammars.guide import Guide, GuideError, Guides
from .versions import VersionOrder, WeightBound

__all__ = ["LlamaCppEngine"]

FinishReason = Literal["stop", "length", "abort"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Seq:
    prompt: Sequence[int]
    params: SamplingParams
    emit: Callable[[EngineEvent | BaseException], None]
    slot: int = -1
    n_fed: int = 0  # prompt tokens already in the KV cache
    n_cached: int = 0  # of those, reused from the slot's previous sequence (prefix cache)
    kv: list[int] = field(default_factory=list, repr=False)  # the ids the slot's KV holds
    n_out: int = 0
    last: int = -1  # the sampled token still to be fed
    sampler: Sampler | None = None
    guide: Guide | None = None
    """Its grammar's walk (a constrained sequence): the mask before each draw."""
    stops: frozenset[int] = frozenset()
    cancelled: bool = False
    done: bool = False
    batch_index: int = field(default=-1, repr=False)
    scoring: list[tuple[int, int]] = field(default_factory=list, repr=False)  # (pos, index)
    prompt_lp: list[TokenEvent] = field(default_factory=list, repr=False)
    leader: _Seq | None = field(default=None, repr=False)
    """A running sequence prefilling the prompt's first `lead` ids: this one feeds none of its
    prompt until the leader has them, then copies them (n > 1, or the same prompt at once)."""
    lead: int = 0
    gen: int = 0
    """The weights generation its KV began under (`LlamaCppEngine._gen`): a sequence frozen by
    `pause?mode=keep` across new weights holds KV of both, which no other prompt reuses."""
    spans: list[list[object]] = field(default_factory=list, repr=False)
    """[version, start, end) of its output tokens, as vLLM's `weight_versions`."""

    @property
    def scores(self) -> bool:
        """Wants the logits of every prompt position (so it can reuse no cached prefix)."""
        return self.params.prompt_logprobs is not None


def _failed(message: str, cause: BaseException) -> EngineError:
    """An EngineError chained to its cause, as `raise ... from cause` chains it: it is handed
    to the consumer, which raises it there."""
    err = EngineError(message)
    err.__cause__ = cause
    return err


def _scored(lp: np.ndarray, token: int, k: int) -> TokenEvent:
    """`token` with its logprob and the `k` most likely tokens, most likely first. An id the
    sampler truncated (-inf in the processed modes) gets vLLM's floor, -9999.0: JSON has no
    -inf, and vLLM sends that floor in every shape."""
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        ids = np.argpartition(-lp, k)[:k]
        ids = ids[np.argsort(-lp[ids], kind="stable")]
        top = tuple((int(i), max(float(lp[i]), LOGPROB_FLOOR)) for i in ids)
    return TokenEvent(token, max(float(lp[token]), LOGPROB_FLOOR), top)


class _EventStream(QueuedEvents):
    """The events of one sequence, queued by the engine's thread."""

    def __init__(self, engine: LlamaCppEngine, seq: _Seq):
        super().__init__()
        self._engine = engine
        self._seq = seq

    def _cancel(self) -> None:
        self._engine._cancel(self._seq)


class LlamaCppEngine(EngineBase):
    """Implements `Engine` for a GGUF model, decoding up to `n_parallel` sequences together."""

    def __init__(self, path: str | Path, *, model_id: str | None = None,
                 max_model_len: int | None = None, n_parallel: int = 4, n_batch: int = 512,
                 n_threads: int | None = None, max_queued: int = 256,
                 tokenizer: HFTokenizer | None = None, prefix_cache: bool = True,
                 count_ubatches: bool = False, deterministic: bool = False,
                 logprobs_mode: str = "raw_logprobs", sampling_mask: bool = False):
        """`model_id` defaults to the file name without its quantization suffix; `tokenizer`:
        the pinned portable tokenizer, checked against llama.cpp's at start; `prefix_cache`:
        off, every prompt is prefilled in full and no slot keeps its KV;
        `count_ubatches`: see `LlamaModel` (tests only); `deterministic`: each sequence is
        decoded in forward passes of its own, with no cached prefix (llama.cpp's kernels take
        other paths for other batch shapes: the same sequence batched with others samples other
        ids now and then), so its output is what it is alone; `logprobs_mode`: vLLM's names,
        raw (the model's distribution) or processed (the one the sampler chain drew from), as
        logprobs or logits; `sampling_mask`: every sampled token carries the ids the chain left
        drawable (vLLM's `--return-sampling-mask`, which also asks for processed logprobs)."""
        if n_batch < n_parallel:
            # every decoding sequence puts one token in each batch
            raise ValueError(f"n_batch ({n_batch}) must be at least n_parallel ({n_parallel})")
        if sampling_mask and logprobs_mode != "processed_logprobs":
            # vLLM's rule: the logprobs are then normalized over the support the mask names
            raise ValueError("sampling_mask needs logprobs_mode 'processed_logprobs'")
        self._path = Path(path)
        self._model_id = model_id or default_model_name(self._path)
        self._want_len = max_model_len
        self._n_parallel = n_parallel
        self._n_batch = n_batch
        self._n_threads = n_threads
        self._max_queued = max_queued
        self._tokenizer = tokenizer
        self._prefix_cache = prefix_cache and not deterministic
        self._solo = deterministic
        self._logprobs_mode = logprobs_mode
        self._sampling_mask = sampling_mask
        self._count_ubatches = count_ubatches
        self._llama: LlamaModel | None = None
        self._info: EngineInfo | None = None
        self._waiting: deque[_Seq] = deque()
        self._active: list[_Seq] = []
        self._slots = Slots(n_parallel)  # sequence slots and the prefix cache; guarded by _cv
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._died: str | None = None
        """Why the worker stopped, when it did on its own (an error outside a step)."""
        self._jobs: deque[tuple[Callable[[], object], concurrent.futures.Future[object]]] = deque()
        """Control calls for the worker to run between two decodes."""
        self._paused: PauseMode | None = None
        self._draining: set[_Seq] = set()
        """pause?mode=wait: the sequences that still run to their end."""
        self._drained: concurrent.futures.Future[None] | None = None
        self._gen = 0
        """Bumped whenever the weights change: KV of an older generation is never reused."""
        self._label = ""
        """The weight version label every sampled token is stamped with."""
        self._order = VersionOrder()
        """Every label it has carried: a request's `min_weight_version` is one of them."""
        self._base_version = ""
        self._weights: Path = self._path
        """The GGUF whose weights serve now (`load_weights` replaces the model's)."""
        self._adapters: list[tuple[Path, float]] = []
        """The LoRA adapters applied now, with their scales."""
        self._model_lock = threading.Lock()
        """Held while another thread reads the model's vocabulary (grammar compiles) and while
        the worker replaces the model."""
        self._guides: Guides | None = None
        """The model's grammar compiler (replaced with the model, under `_model_lock`)."""
        self.on_step: Callable[[int], None] | None = None
        """Called from the worker thread after each decode with its batch size in tokens
        (metrics); it must be quick and must not raise."""

    # -- lifecycle -------------------------------------------------------------------------

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

    @staticmethod
    def _new_guides(llama: LlamaModel) -> Guides:
        return Guides(llama.vocab, llama.n_vocab, sorted(llama.eog_ids()))

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

    def _new_model(self, path: Path) -> LlamaModel:
        return LlamaModel(path, n_seq=self._n_parallel, max_len=self._want_len,
                          n_batch=self._n_batch, n_threads=self._n_threads,
                          count_ubatches=self._count_ubatches)

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

    @property
    def info(self) -> EngineInfo:
        if self._info is None:
            raise ServiceUnavailableError("the engine has not been started")
        return self._info

    @property
    def llama(self) -> LlamaModel:
        """The loaded model, for reference checks (its own tokenizer); not for serving."""
        if self._llama is None:
            raise ServiceUnavailableError("the engine has not been started")
        return self._llama

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

    # -- the async side --------------------------------------------------------------------

    async def submit(self, prompt: Sequence[int], params: SamplingParams) -> _EventStream:
        """Admit a sequence now (raising if the engine is down or its queue is full)."""
        await self.prepare(prompt, params)
        loop = asyncio.get_running_loop()
        seq = _Seq(prompt=list(prompt), params=params, emit=lambda ev: None)
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
        seq = _Seq(prompt=list(prompt), params=params, emit=emit)
        self._enqueue(seq)
        return lambda: self._cancel(seq)

    def _enqueue(self, seq: _Seq) -> None:
        with self._cv:
            if self._stopping or self._thread is None or not self._thread.is_alive():
                raise ServiceUnavailableError("the engine is not running")
            # sequences beyond the free slots wait; at most max_queued of them
            if len(self._waiting) - len(self._slots.free) >= self._max_queued:
                raise RateLimitError("too many requests are waiting for the engine")
            self._waiting.append(seq)
            self._cv.notify()

    def _cancel(self, seq: _Seq) -> None:
        with self._cv:
            if not seq.done:
                seq.cancelled = True
                self._cv.notify()

    # -- the worker thread -----------------------------------------------------------------

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

    def _admissible(self, seq: _Seq) -> bool:
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
                            seq.emit(_failed(f"the engine failed: {exc}", exc))
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

    # -- the prefix cache --------------------------------------------------------------------

    def _live(self, seq: _Seq, *, but: _Seq | None = None) -> dict[int, list[int]]:
        """slot -> the ids in its cells, for every running sequence `seq` may reuse (one with
        its cache salt, except `but`)."""
        salt = seq.params.cache_salt
        return {s.slot: s.kv for s in self._active
                if s is not but and s.kv and s.params.cache_salt == salt and s.gen == self._gen}

    def _place(self, seq: _Seq) -> None:
        """Give `seq` a slot and as much of its prompt's KV as some slot already holds; or make
        it follow a running sequence that is prefilling the same prompt."""
        place = self._slots.take(seq.prompt, self._live(seq), seq.params.cache_salt)
        seq.slot = place.slot
        reuse = self._prefix_cache and not seq.scores
        limit = len(seq.prompt) - 1  # the last prompt id is always fed: its logits come next
        own = min(place.own, limit) if reuse else 0
        shared = min(place.shared, limit) if reuse else 0
        leader, lead = None, 0
        for other in self._active if reuse else ():
            if other.leader is None and other.params.cache_salt == seq.params.cache_salt \
                    and other.gen == self._gen:
                n = min(common_prefix(other.prompt, seq.prompt), limit)
                if n > lead and other.n_fed < n:
                    leader, lead = other, n
        self._reuse(seq, seq.slot, own)  # cut what the slot held after the shared prefix
        if leader is not None and lead >= max(shared, own) + MIN_COPY:
            seq.leader, seq.lead = leader, lead
        else:
            self._copy_prefix(seq, place.source, shared)

    def _catch_up(self, seq: _Seq) -> None:
        """Copy the leader's prefix once it has fed it (or the best one left, if it is gone)."""
        leader = seq.leader
        assert leader is not None
        if not leader.done and leader.n_fed < seq.lead:
            return
        seq.leader = None
        if not leader.done:
            self._reuse(seq, leader.slot, seq.lead)
            return
        source, shared = self._slots.best_source(seq.prompt, self._live(seq, but=seq),
                                                 seq.params.cache_salt)
        self._copy_prefix(seq, source, min(shared, len(seq.prompt) - 1))

    def _copy_prefix(self, seq: _Seq, source: int, shared: int) -> None:
        """Copy the first `shared` prompt ids from slot `source`, when that beats feeding them:
        more than `seq` holds already, and at least MIN_COPY (a copy moves a whole stream)."""
        if source not in (-1, seq.slot) and shared >= max(seq.n_fed + 1, MIN_COPY):
            self._reuse(seq, source, shared)

    def _reuse(self, seq: _Seq, source: int, keep: int) -> None:
        """Make `seq`'s slot hold its first `keep` prompt ids and nothing after them, from its
        own cells or from `source`'s (another slot, whose stream is copied)."""
        llama = self.llama
        if source != seq.slot:
            llama.copy(source, seq.slot)
        if not llama.forget_from(seq.slot, keep):  # a memory that cannot cut: start empty
            keep = 0
            llama.forget(seq.slot)
        seq.n_cached += keep - seq.n_fed
        seq.n_fed = keep
        seq.kv = list(seq.prompt[:keep])

    def _admit(self, seq: _Seq) -> None:
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
            seq.emit(_failed(str(exc), exc))
            return
        self._active.append(seq)

    def _release(self, seq: _Seq, *, keep: bool = True) -> None:
        """Free the sequence's sampler and slot. `keep`: the slot's KV stays, remembered by the
        ids it holds, for a later prompt that starts with them (not after a failed step, whose
        KV is unknown)."""
        seq.done = True
        seq.leader = None
        if seq in self._draining:
            self._draining.discard(seq)
            self._check_drained()
        keep = keep and self._prefix_cache and seq.gen == self._gen
        if seq in self._active:
            self._active.remove(seq)
        if seq.sampler is not None:
            seq.sampler.free()
            seq.sampler = None
        if seq.slot >= 0:
            if not (keep and seq.kv):
                self.llama.forget(seq.slot)
            self._slots.release(seq.slot, seq.kv if keep else None, seq.params.cache_salt)
            seq.slot = -1

    def _step(self, llama: LlamaModel, batch: Batch) -> None:
        if not self._solo:
            self._pass(llama, batch, self._active)
            return
        for seq in list(self._active):  # deterministic: one sequence per forward pass
            if not seq.done:
                self._pass(llama, batch, [seq])

    def _pass(self, llama: LlamaModel, batch: Batch, seqs: Sequence[_Seq]) -> None:
        """One `llama_decode` for `seqs`: a token of each decoding one, prompt chunks of the
        others in what room is left; then each one whose logits came is sampled."""
        budget = self._n_batch
        sampling: list[_Seq] = []
        feeds: list[tuple[_Seq, int]] = []  # (sequence, prompt ids to feed now)
        # decoding sequences first: one token each keeps every stream moving
        for seq in seqs:
            if seq.n_fed == len(seq.prompt):
                feeds.append((seq, 0))
                budget -= 1
        # then prompt chunks, oldest request first, in what room is left
        for seq in seqs:
            remaining = len(seq.prompt) - seq.n_fed
            if budget <= 0:
                break
            if remaining > 0 and seq.leader is None:
                take = min(remaining, budget)
                feeds.append((seq, take))
                budget -= take
        # in slot order: llama.cpp splits a batch over per-sequence streams into ubatches of
        # consecutive sequence ids with as many tokens each (llama_batch_allocr::split_equal),
        # so slot order keeps decode-only steps to one forward pass
        feeds.sort(key=lambda f: f[0].slot)
        batch.clear()
        for seq, take in feeds:
            if take == 0:
                pos = len(seq.prompt) + seq.n_out - 1
                seq.batch_index = batch.add((seq.last,), pos, seq.slot)
                seq.kv.append(seq.last)
                sampling.append(seq)
                continue
            start = seq.n_fed
            chunk = seq.prompt[start:start + take]
            last = start + take == len(seq.prompt)
            first = batch.add(chunk, start, seq.slot, logits=seq.scores, last_logits=last)
            if seq.scores:
                seq.scoring.extend((start + k, first + k) for k in range(take - last))
            if last:
                seq.batch_index = first + take - 1
                sampling.append(seq)
            seq.kv += chunk
            seq.n_fed += take
        rc = llama.decode(batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        if self.on_step is not None:
            self.on_step(batch.n)
        for seq in seqs:
            if seq.scoring:
                k = seq.params.prompt_logprobs or 0
                for pos, idx in seq.scoring:
                    seq.prompt_lp.append(_scored(llama.logprobs(idx), seq.prompt[pos + 1], k))
                seq.scoring.clear()
        for seq in sampling:
            if seq.n_out == 0 and seq.params.prompt_logprobs is not None:
                seq.emit(PromptLogprobsEvent(tuple(seq.prompt_lp)))
            if seq.params.max_tokens <= 0:
                with self._cv:
                    self._release(seq)
                seq.emit(FinishEvent("length", cached_tokens=seq.n_cached))
                continue
            self._sample(llama, seq)

    def _sample(self, llama: LlamaModel, seq: _Seq) -> None:
        assert seq.sampler is not None
        mode = self._logprobs_mode
        k = seq.params.logprobs
        lp = None
        if k is not None and mode.startswith("raw"):
            lp = llama.logprobs(seq.batch_index) if mode == "raw_logprobs" \
                else llama.logits(seq.batch_index)
        try:
            if seq.guide is not None:
                seq.guide.mask(llama.raw(seq.batch_index))  # after the raw logprobs were read
            if seq.n_out < seq.params.min_tokens and self._may_ban(llama, seq):
                llama.ban(seq.batch_index, seq.stops)  # likewise
        except RuntimeError as exc:  # the grammar's own failure: this sequence's alone
            self._fail(seq, exc)
            return
        mask = None
        if self._sampling_mask or (k is not None and mode.startswith("processed")):
            token, processed = seq.sampler.sample_processed(llama, seq.batch_index)
            if k is not None:
                lp = log_softmax(processed) if mode == "processed_logprobs" else processed
            if self._sampling_mask:
                mask = tuple(np.flatnonzero(np.isfinite(processed)).tolist())
        else:
            token = seq.sampler.sample(llama, seq.batch_index)
        if seq.guide is not None:
            try:
                seq.guide.accept(token)
            except RuntimeError as exc:
                self._fail(seq, exc)
                return
        ev = TokenEvent(token) if lp is None else _scored(lp, token, k or 0)
        if mask is not None:
            ev = replace(ev, sampling_mask=mask)
        seq.n_out += 1
        span = seq.spans[-1] if seq.spans else None
        if span is not None and span[0] == self._version:
            span[2] = seq.n_out
        else:
            seq.spans.append([self._version, seq.n_out - 1, seq.n_out])
            ev = replace(ev, weight_version=self._version)
        finished: FinishEvent | None = None
        if token in seq.stops:
            finished = self._finish(seq, "stop", stop_token=ev)
        else:
            seq.emit(ev)
            seq.last = token
            full = len(seq.prompt) + seq.n_out >= llama.n_ctx_seq
            if seq.n_out >= seq.params.max_tokens or full:
                finished = self._finish(seq, "length")
        if finished is not None:
            with self._cv:
                self._release(seq)
            seq.emit(finished)

    @staticmethod
    def _may_ban(llama: LlamaModel, seq: _Seq) -> bool:
        """`min_tokens` may ban the stop ids unless a grammar allows nothing else: a finished
        document ends there (vLLM's order: the grammar's mask, then the penalties)."""
        if seq.guide is None:
            return True
        others = np.isfinite(llama.raw(seq.batch_index))
        others[list(seq.stops)] = False
        return bool(others.any())

    def _fail(self, seq: _Seq, exc: Exception) -> None:
        log.error("a constrained sequence failed: %s", exc)
        with self._cv:
            self._release(seq, keep=False)
        seq.emit(_failed(f"the grammar failed: {exc}", exc))

    def _finish(self, seq: _Seq, reason: FinishReason,
                stop_token: TokenEvent | None = None) -> FinishEvent:
        spans = tuple(WeightSpan(str(v), int(a), int(b))  # type: ignore[call-overload]
                      for v, a, b in seq.spans)
        return FinishEvent(reason, stop_token=stop_token, cached_tokens=seq.n_cached,
                           weight_versions=spans or None)

    # -- the control plane (on the worker thread, between decodes) --------------------------

    async def control(self, call: ControlCall) -> list[ControlAnswer]:
        """vLLM's RL endpoints, answered by this engine (_llama_control.py); one replica: nothing
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

    @property
    def _version(self) -> str:
        return self._label

    @_version.setter
    def _version(self, label: str) -> None:
        self._label = label
        self._order.see([label])

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

    def _check_drained(self) -> None:
        if self._drained is not None and not self._draining and not self._drained.done():
            self._drained.set_result(None)

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

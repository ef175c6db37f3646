"""What the embedded engine holds, and a sequence's record: the state the other modules of
the package work on (each a base of `LlamaCppEngine`), with releasing and finishing a sequence."""

from __future__ import annotations

import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ...config import default_model_name
from ...errors import (
    EngineError,
    ServiceUnavailableError,
)
from ...tokenizers.hf import HFTokenizer
from ..base import (
    EngineBase,
    EngineEvent,
    EngineInfo,
    FinishEvent,
    SamplingParams,
    TokenEvent,
    WeightSpan,
)
from ..grammars.guide import Guide, Guides
from ..versions import VersionOrder
from .model import (
    LlamaModel,
    Sampler,
)
from .rl_endpoints import PauseMode
from .slots import Slots

FinishReason = Literal["stop", "length", "abort"]


@dataclass(eq=False)
class Seq:
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
    leader: Seq | None = field(default=None, repr=False)
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


def failed(message: str, cause: BaseException) -> EngineError:
    """An EngineError chained to its cause, as `raise ... from cause` chains it: it is handed
    to the consumer, which raises it there."""
    err = EngineError(message)
    err.__cause__ = cause
    return err


class EngineState(EngineBase):
    """The engine's state and what every part of it uses; `LlamaCppEngine` is the whole."""

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
        self._waiting: deque[Seq] = deque()
        self._active: list[Seq] = []
        self._slots = Slots(n_parallel)  # sequence slots and the prefix cache; guarded by _cv
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._died: str | None = None
        """Why the worker stopped, when it did on its own (an error outside a step)."""
        self._jobs: deque[tuple[Callable[[], object], concurrent.futures.Future[object]]] = deque()
        """Control calls for the worker to run between two decodes."""
        self._paused: PauseMode | None = None
        self._draining: set[Seq] = set()
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

    @staticmethod
    def _new_guides(llama: LlamaModel) -> Guides:
        return Guides(llama.vocab, llama.n_vocab, sorted(llama.eog_ids()))

    def _new_model(self, path: Path) -> LlamaModel:
        return LlamaModel(path, n_seq=self._n_parallel, max_len=self._want_len,
                          n_batch=self._n_batch, n_threads=self._n_threads,
                          count_ubatches=self._count_ubatches)

    def _release(self, seq: Seq, *, keep: bool = True) -> None:
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

    def _finish(self, seq: Seq, reason: FinishReason,
                stop_token: TokenEvent | None = None) -> FinishEvent:
        spans = tuple(WeightSpan(str(v), int(a), int(b))  # type: ignore[call-overload]
                      for v, a, b in seq.spans)
        return FinishEvent(reason, stop_token=stop_token, cached_tokens=seq.n_cached,
                           weight_versions=spans or None)

    def _check_drained(self) -> None:
        if self._drained is not None and not self._draining and not self._drained.done():
            self._drained.set_result(None)

    @property
    def _version(self) -> str:
        return self._label

    @_version.setter
    def _version(self, label: str) -> None:
        self._label = label
        self._order.see([label])

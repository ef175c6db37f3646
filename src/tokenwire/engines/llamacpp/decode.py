"""One decode step: the batch packed (decoding sequences first, then prompt chunks), one
`llama_decode`, then each sequence whose logits came sampled by its own chain."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..base import (
    LOGPROB_FLOOR,
    FinishEvent,
    PromptLogprobsEvent,
    TokenEvent,
)
from .model import (
    Batch,
    LlamaModel,
    log_softmax,
)
from .state import EngineState, Seq, failed

log = logging.getLogger(__name__)


def scored(lp: np.ndarray, token: int, k: int) -> TokenEvent:
    """`token` with its logprob and the `k` most likely tokens, most likely first. An id the
    sampler truncated (-inf in the processed modes) gets vLLM's floor, -9999.0: JSON has no
    -inf, and vLLM sends that floor in every shape."""
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        ids = np.argpartition(-lp, k)[:k]
        ids = ids[np.argsort(-lp[ids], kind="stable")]
        top = tuple((int(i), max(float(lp[i]), LOGPROB_FLOOR)) for i in ids)
    return TokenEvent(token, max(float(lp[token]), LOGPROB_FLOOR), top)


class Decoding(EngineState):
    """The worker's step (on the worker thread)."""

    def _step(self, llama: LlamaModel, batch: Batch) -> None:
        if not self._solo:
            self._pass(llama, batch, self._active)
            return
        for seq in list(self._active):  # deterministic: one sequence per forward pass
            if not seq.done:
                self._pass(llama, batch, [seq])

    def _pass(self, llama: LlamaModel, batch: Batch, seqs: Sequence[Seq]) -> None:
        """One `llama_decode` for `seqs`: a token of each decoding one, prompt chunks of the
        others in what room is left; then each one whose logits came is sampled."""
        budget = self._n_batch
        sampling: list[Seq] = []
        feeds: list[tuple[Seq, int]] = []  # (sequence, prompt ids to feed now)
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
                    seq.prompt_lp.append(scored(llama.logprobs(idx), seq.prompt[pos + 1], k))
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

    def _sample(self, llama: LlamaModel, seq: Seq) -> None:
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
        ev = TokenEvent(token) if lp is None else scored(lp, token, k or 0)
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
    def _may_ban(llama: LlamaModel, seq: Seq) -> bool:
        """`min_tokens` may ban the stop ids unless a grammar allows nothing else: a finished
        document ends there (vLLM's order: the grammar's mask, then the penalties)."""
        if seq.guide is None:
            return True
        others = np.isfinite(llama.raw(seq.batch_index))
        others[list(seq.stops)] = False
        return bool(others.any())

    def _fail(self, seq: Seq, exc: Exception) -> None:
        log.error("a constrained sequence failed: %s", exc)
        with self._cv:
            self._release(seq, keep=False)
        seq.emit(failed(f"the grammar failed: {exc}", exc))

"""Thin, typed wrappers over llama-cpp-python's low-level (ctypes) API.

Only what the engine needs: load a model, make a context with one KV stream per sequence,
fill a `llama_batch` for several sequences, build a C-side sampler chain, read logits.
Every call here must come from the engine's own thread, except load and free.
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path
from typing import cast

import llama_cpp as L
import numpy as np

from .base import Grammar

__all__ = ["Batch", "GrammarError", "LlamaModel", "Sampler", "check_grammar", "silence_logs",
           "vocab_eog_ids"]

_LOG_CB = None


def silence_logs() -> None:
    """Route llama.cpp's stderr chatter nowhere (it logs every load in detail)."""
    global _LOG_CB
    if _LOG_CB is None:
        _LOG_CB = L.llama_log_callback(lambda level, text, data: None)
        L.llama_log_set(_LOG_CB, ctypes.c_void_p())


def vocab_eog_ids(path: str | Path) -> frozenset[int]:
    """The end-of-generation ids llama.cpp derives for a GGUF (its own rules: the EOS/EOT/EOM
    ids and known end-of-turn token texts), from the vocabulary alone: no weights loaded."""
    silence_logs()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise RuntimeError(f"llama.cpp could not read the vocabulary of {path}")
    try:
        vocab = L.llama_model_get_vocab(model)
        n = L.llama_vocab_n_tokens(vocab)
        return frozenset(t for t in range(n) if L.llama_vocab_is_eog(vocab, t))
    finally:
        L.llama_model_free(model)


class LlamaModel:
    """A loaded model and one context that decodes up to `n_seq` sequences together."""

    def __init__(self, path: str | Path, *, n_seq: int, max_len: int | None, n_batch: int,
                 n_threads: int | None = None):
        silence_logs()
        L.llama_backend_init()
        mparams = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = L.llama_model_n_ctx_train(self.model)
        n_ctx_seq = min(max_len or self.n_ctx_train, self.n_ctx_train)
        cparams = L.llama_context_default_params()
        cparams.n_ctx = n_ctx_seq * n_seq
        cparams.n_seq_max = n_seq
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        threads = n_threads or max(1, os.cpu_count() or 1)
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.kv_unified = False  # each sequence gets its own n_ctx_seq cells
        cparams.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            L.llama_model_free(self.model)
            raise RuntimeError("llama.cpp could not create a context")
        self.n_ctx_seq = L.llama_n_ctx_seq(self.ctx)
        self.n_batch = n_batch
        self.memory = L.llama_get_memory(self.ctx)

    def is_eog(self, token: int) -> bool:
        return bool(L.llama_vocab_is_eog(self.vocab, token))

    def eog_ids(self) -> frozenset[int]:
        return frozenset(t for t in range(self.n_vocab) if self.is_eog(t))

    def tokenize(self, text: str, *, parse_special: bool = False) -> list[int]:
        """llama.cpp's own tokenizer: the reference the published artifact must match."""
        data = text.encode()
        cap = len(data) + 8
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, False, parse_special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, False, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[:n]

    def decode(self, batch: Batch) -> int:
        return int(L.llama_decode(self.ctx, batch.raw))

    def forget(self, seq_id: int) -> None:
        """Drop a sequence's KV cells so its slot can take a new prompt."""
        L.llama_memory_seq_rm(self.memory, seq_id, -1, -1)

    def forget_from(self, seq_id: int, pos: int) -> bool:
        """Drop a sequence's KV cells from position `pos` on (keeping the prefix before it);
        False where the memory cannot cut a sequence there."""
        return bool(L.llama_memory_seq_rm(self.memory, seq_id, pos, -1))

    def logprobs(self, index: int) -> np.ndarray:
        """log_softmax of the raw logits of the batch entry `index`."""
        ptr = L.llama_get_logits_ith(self.ctx, index)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float64)
        m = logits.max()
        out: np.ndarray = logits - (m + np.log(np.exp(logits - m).sum()))
        return out

    def close(self) -> None:
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            L.llama_model_free(self.model)
            self.model = None


class Batch:
    """A reusable `llama_batch` holding tokens of several sequences."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.raw = L.llama_batch_init(capacity, 0, 1)
        self.n = 0

    def clear(self) -> None:
        self.n = 0
        self.raw.n_tokens = 0

    def add(self, token: int, pos: int, seq_id: int, logits: bool) -> int:
        """Append one token; returns its index in the batch (for reading its logits)."""
        i = self.n
        raw = self.raw
        raw.token[i] = token
        raw.pos[i] = pos
        raw.n_seq_id[i] = 1
        raw.seq_id[i][0] = seq_id
        raw.logits[i] = logits
        self.n = i + 1
        raw.n_tokens = self.n
        return i

    def free(self) -> None:
        L.llama_batch_free(self.raw)


class GrammarError(ValueError):
    """llama.cpp could not parse a grammar."""


def _grammar_sampler(vocab: L.llama_vocab_p, grammar: Grammar) -> L.llama_sampler_p:
    gbnf = grammar.gbnf.encode()
    if not grammar.lazy:
        ptr = L.llama_sampler_init_grammar(vocab, gbnf, b"root")
    else:
        # llama.cpp's own rule for trigger words (common/sampling.cpp): free text up to the
        # first word, then the grammar from where the captured word starts
        words = "|".join(re.escape(w) for w in grammar.triggers)
        patterns = (ctypes.c_char_p * 1)(f"^[\\s\\S]*?({words})[\\s\\S]*".encode())
        ptr = L.llama_sampler_init_grammar_lazy_patterns(vocab, gbnf, b"root", patterns, 1,
                                                         None, 0)
    if not ptr:
        raise GrammarError("llama.cpp could not parse the grammar")
    return cast("L.llama_sampler_p", ptr)


def check_grammar(model: LlamaModel, grammar: Grammar) -> None:
    """Raise `GrammarError` unless llama.cpp parses `grammar` (it only reads the vocabulary,
    so any thread may call this)."""
    L.llama_sampler_free(_grammar_sampler(model.vocab, grammar))


class Sampler:
    """A C-side `llama_sampler` chain: grammar -> penalties -> temperature -> top-p -> draw (or
    greedy)."""

    def __init__(self, model: LlamaModel, *, temperature: float, top_p: float, seed: int,
                 presence_penalty: float, frequency_penalty: float, window: int,
                 grammar: Grammar | None = None):
        n_vocab = model.n_vocab
        self.ptr = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if grammar is not None:
            try:
                L.llama_sampler_chain_add(self.ptr, _grammar_sampler(model.vocab, grammar))
            except GrammarError:
                self.free()
                raise
        if presence_penalty or frequency_penalty:
            # OpenAI's penalties count only the output (the prompt is never accepted here);
            # `window` covers all of it
            L.llama_sampler_chain_add(
                self.ptr,
                L.llama_sampler_init_penalties(
                    n_vocab, max(1, window), 1.0, frequency_penalty, presence_penalty
                ),
            )
        if temperature <= 0.0:
            L.llama_sampler_chain_add(self.ptr, L.llama_sampler_init_greedy())
        else:
            L.llama_sampler_chain_add(self.ptr, L.llama_sampler_init_temp(temperature))
            if top_p < 1.0:
                L.llama_sampler_chain_add(self.ptr, L.llama_sampler_init_top_p(top_p, 1))
            L.llama_sampler_chain_add(self.ptr, L.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def sample(self, model: LlamaModel, index: int) -> int:
        """Draw from the logits of batch entry `index` (and record the token in the chain)."""
        return int(L.llama_sampler_sample(self.ptr, model.ctx, index))

    def free(self) -> None:
        if self.ptr:
            L.llama_sampler_free(self.ptr)
            self.ptr = None

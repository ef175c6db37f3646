"""Thin, typed wrappers over llama-cpp-python's low-level (ctypes) API.

Only what the engine needs: load a model, make a context with one KV stream per sequence,
fill a `llama_batch` for several sequences, build a C-side sampler chain, read logits.
Every call here must come from the engine's own thread, except load and free.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import llama_cpp as L
import numpy as np

from ..cpu import Threadpool, load_cpu_backend

__all__ = ["Batch", "LlamaModel", "LoraError", "Sampler", "default_threads", "log_softmax",
           "silence_logs", "vocab_eog_ids"]

_LOG_CB = None


def silence_logs() -> None:
    """Route llama.cpp's stderr chatter nowhere (it logs every load in detail)."""
    global _LOG_CB
    load_cpu_backend()  # before llama.cpp looks for a backend (a build with CPU variants)
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
                 n_threads: int | None = None, count_ubatches: bool = False):
        """`count_ubatches`: count the forward passes each `decode` runs (`ubatches`), through
        llama.cpp's per-tensor eval callback, which slows every pass: for tests only."""
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
        threads = n_threads or default_threads()
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        # a stream of n_ctx_seq cells per sequence: attention reads only its own sequence's
        # cells (a unified cache makes every token read every held cell, 13-28% slower per step
        # here with the prefix cache full); the price is llama.cpp's split rule for streams,
        # which the engine shapes its batches for (see `ubatches`)
        cparams.kv_unified = False
        cparams.no_perf = True
        self.ubatches = 0
        self._eval_cb = None
        if count_ubatches:
            self._eval_cb = _ubatch_counter(self)
            cparams.cb_eval = self._eval_cb
        self.ctx = None
        self._adapters: list[L.llama_adapter_lora_p] = []
        self._threads: Threadpool | None = None
        try:
            self._threads = Threadpool(threads)
            self.ctx = L.llama_init_from_model(self.model, cparams)
            if not self.ctx:
                raise RuntimeError("llama.cpp could not create a context")
            _attach_threadpool(self.ctx, self._threads.handle, self._threads.handle)
        except Exception:
            self.close()  # what was made, in close's order
            raise
        self.n_ctx_seq = L.llama_n_ctx_seq(self.ctx)
        self.n_batch = n_batch
        self.memory = L.llama_get_memory(self.ctx)

    def set_lora(self, adapters: Sequence[tuple[str | Path, float]]) -> None:
        """Serve the model with these LoRA adapters (GGUF files, each with its scale) instead
        of the ones set before; none: the bare model. Raises `LoraError`, keeping the adapters
        it had, when llama.cpp cannot load one for this model."""
        loaded: list[L.llama_adapter_lora_p] = []
        for path, _ in adapters:
            ptr = L.llama_adapter_lora_init(self.model, str(path).encode())
            if not ptr:
                for p in loaded:
                    L.llama_adapter_lora_free(p)
                raise LoraError(f"llama.cpp could not load the LoRA adapter {path} for this "
                                "model (its log says why: another architecture, or shapes)")
            loaded.append(ptr)
        n = len(loaded)
        ptrs = (L.llama_adapter_lora_p_ctypes * max(n, 1))(*loaded)  # type: ignore[misc]
        scales = (ctypes.c_float * max(n, 1))(*(float(s) for _, s in adapters))
        if L.llama_set_adapters_lora(self.ctx, ptrs if n else None, n, scales if n else None):
            for p in loaded:
                L.llama_adapter_lora_free(p)
            raise LoraError("llama.cpp refused to set the LoRA adapters")
        for p in self._adapters:
            L.llama_adapter_lora_free(p)
        self._adapters = loaded

    def same_vocabulary(self, other: LlamaModel) -> str | None:
        """None if `other` reads and writes ids as this model does (every id's piece and
        end-of-generation flag); else the first difference."""
        if other.n_vocab != self.n_vocab:
            return f"{other.n_vocab} ids, not {self.n_vocab}"
        for t in range(self.n_vocab):
            if other.piece(t) != self.piece(t) or other.is_eog(t) != self.is_eog(t):
                return f"id {t} is {other.piece(t)!r}, not {self.piece(t)!r}"
        return None

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

    def copy(self, src: int, dst: int) -> None:
        """Make sequence `dst` hold what `src` holds. Streams are copied whole (llama.cpp
        cannot copy part of one), at the start of the next `decode`; `forget_from` may cut
        `dst` at once, since the cells' bookkeeping is copied now."""
        L.llama_memory_seq_cp(self.memory, src, dst, -1, -1)

    def logits(self, index: int) -> np.ndarray:
        """The raw logits of the batch entry `index` (a copy)."""
        ptr = L.llama_get_logits_ith(self.ctx, index)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float64)

    def logprobs(self, index: int) -> np.ndarray:
        """log_softmax of the raw logits of the batch entry `index`."""
        return log_softmax(self.logits(index))

    def raw(self, index: int) -> np.ndarray:
        """The raw logits of the batch entry `index`, in place (float32, writable: what is
        written here is what the sampler chain reads; read `logprobs` first)."""
        ptr = L.llama_get_logits_ith(self.ctx, index)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def ban(self, index: int, ids: Iterable[int]) -> None:
        """Make `ids` unsampleable at batch entry `index` (their raw logits set to -inf)."""
        self.raw(index)[list(ids)] = -np.inf

    def close(self) -> None:
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None
        if self._threads is not None:
            self._threads.close()  # after the context that uses it
        for p in self._adapters:  # after the context that uses them, before their model
            L.llama_adapter_lora_free(p)
        self._adapters = []
        if self.model:
            L.llama_model_free(self.model)
            self.model = None


class Batch:
    """A reusable `llama_batch` holding tokens of several sequences, filled through numpy views
    of its arrays (a long prompt chunk is a few slice assignments, not one ctypes store per
    field and token)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.raw = L.llama_batch_init(capacity, 0, 1)
        raw = self.raw
        self.token = np.ctypeslib.as_array(raw.token, shape=(capacity,))
        self.pos = np.ctypeslib.as_array(raw.pos, shape=(capacity,))
        self.logits = np.ctypeslib.as_array(raw.logits, shape=(capacity,))
        np.ctypeslib.as_array(raw.n_seq_id, shape=(capacity,))[:] = 1
        # one sequence per token: point each token's seq_id list into one array of ours, so
        # it can be filled as a slice (the pointers llama.cpp allocated go back before free)
        self.seq = np.zeros(capacity, dtype=np.int32)
        pointers = ctypes.cast(raw.seq_id, ctypes.POINTER(ctypes.c_void_p))
        self._pointers = pointers
        self._own_seq_ids = [pointers[i] for i in range(capacity)]  # addresses, as ints
        base, step = self.seq.ctypes.data, self.seq.itemsize
        for i in range(capacity):
            pointers[i] = base + i * step
        self.n = 0

    def clear(self) -> None:
        self.n = 0
        self.raw.n_tokens = 0

    def add(self, tokens: Sequence[int], pos: int, seq_id: int, *, logits: bool = False,
            last_logits: bool = True) -> int:
        """Append `tokens` of one sequence at positions `pos`, `pos + 1`, ...; `logits`: every
        token's logits are wanted, `last_logits`: the last one's. Returns the index of the
        first token in the batch (logits are read by index)."""
        i, k = self.n, len(tokens)
        j = i + k
        if j > self.capacity:
            raise ValueError(f"batch overflow: {j} tokens > {self.capacity}")
        self.token[i:j] = tokens
        self.pos[i:j] = np.arange(pos, pos + k, dtype=self.pos.dtype)
        self.seq[i:j] = seq_id
        self.logits[i:j] = logits
        if last_logits and k:
            self.logits[j - 1] = 1
        self.n = j
        self.raw.n_tokens = j
        return i

    def free(self) -> None:
        for i, address in enumerate(self._own_seq_ids):
            self._pointers[i] = address
        L.llama_batch_free(self.raw)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Over the finite entries (-inf stays -inf: what a sampler truncated)."""
    m = logits.max()
    out: np.ndarray = logits - (m + np.log(np.exp(logits - m).sum()))
    return out


def _attach_threadpool(ctx: object, pool: int | None, batch: int | None) -> None:
    """llama.cpp's `llama_attach_threadpool` (llama-cpp-python binds no wrapper of it)."""
    f = L.llama_cpp._lib.llama_attach_threadpool
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    f.restype = None
    f(ctx, pool, batch)


def default_threads() -> int:
    """llama.cpp's compute threads when none are configured: every core this process may run
    on (its affinity, not the machine's count), as llama-server does by default."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _ubatch_counter(model: LlamaModel) -> object:
    """An eval callback that counts the graph computations reaching the output tensor: one per
    ubatch (llama.cpp names it `result_output` in every architecture's graph)."""
    ggml = ctypes.CDLL(str(Path(L.__file__).parent / "lib" / "libggml-base.so"))
    ggml.ggml_get_name.restype = ctypes.c_char_p
    ggml.ggml_get_name.argtypes = [ctypes.c_void_p]

    @L.ggml_backend_sched_eval_callback  # type: ignore[untyped-decorator]
    def counter(tensor: int, ask: bool, _data: int) -> bool:
        if ggml.ggml_get_name(tensor) != b"result_output":
            return False
        if not ask:
            model.ubatches += 1
        return True

    return counter


_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
"""llama.cpp's `llama_token_data`, as numpy lays it out (12 bytes, no padding)."""


class LoraError(ValueError):
    """llama.cpp could not load or set a LoRA adapter."""


class Sampler:
    """A C-side `llama_sampler` chain in vLLM's order (vllm/v1/sample/sampler.py): logit bias
    -> penalties -> temperature -> min-p -> top-k -> top-p -> draw (or greedy); a grammar's
    mask is written into the raw logits before it (_guide.py)."""

    def __init__(self, model: LlamaModel, *, temperature: float, top_p: float, seed: int,
                 presence_penalty: float, frequency_penalty: float, window: int,
                 top_k: int = 0, min_p: float = 0.0,
                 repetition_penalty: float = 1.0, prompt: Sequence[int] = (),
                 logit_bias: Sequence[tuple[int, float]] = ()):
        n_vocab = model.n_vocab
        self._candidates: np.ndarray | None = None
        self.ptr = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        add = functools.partial(L.llama_sampler_chain_add, self.ptr)
        if logit_bias:
            biases = (L.llama_logit_bias * len(logit_bias))(
                *(L.llama_logit_bias(t, b) for t, b in logit_bias))
            add(L.llama_sampler_init_logit_bias(n_vocab, len(logit_bias), biases))
        if repetition_penalty != 1.0:
            # vLLM's repetition penalty counts the prompt too, OpenAI's penalties only the
            # output: two samplers, the first also fed the prompt (the chain owns it, the
            # pointer stays valid while the chain lives)
            rep = L.llama_sampler_init_penalties(n_vocab, max(1, len(prompt) + window),
                                                 repetition_penalty, 0.0, 0.0)
            add(rep)
            for token in prompt:
                L.llama_sampler_accept(rep, token)
        if presence_penalty or frequency_penalty:
            # OpenAI's penalties count only the output (the prompt is never accepted here);
            # `window` covers all of it
            add(L.llama_sampler_init_penalties(n_vocab, max(1, window), 1.0,
                                               frequency_penalty, presence_penalty))
        if temperature <= 0.0:
            add(L.llama_sampler_init_greedy())
        else:
            add(L.llama_sampler_init_temp(temperature))
            if min_p > 0.0:
                add(L.llama_sampler_init_min_p(min_p, 1))
            if top_k > 0:
                add(L.llama_sampler_init_top_k(top_k))
            if top_p < 1.0:
                add(L.llama_sampler_init_top_p(top_p, 1))
            add(L.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def sample(self, model: LlamaModel, index: int) -> int:
        """Draw from the logits of batch entry `index` (and record the token in the chain)."""
        return int(L.llama_sampler_sample(self.ptr, model.ctx, index))

    def sample_processed(self, model: LlamaModel, index: int) -> tuple[int, np.ndarray]:
        """`sample`, done as llama.cpp's `llama_sampler_sample` does it (apply the chain to
        the candidates, take the one it selected, accept it), keeping what the chain left of
        the logits: after the grammar's mask, bias, penalties, temperature, min-p, top-k and
        top-p, -inf for every id it truncated (vLLM's processed logits)."""
        n = model.n_vocab
        if self._candidates is None:
            self._candidates = np.zeros(n, dtype=_TOKEN_DATA)
            self._candidates["id"] = np.arange(n, dtype=np.int32)
        cand = self._candidates
        ptr = L.llama_get_logits_ith(model.ctx, index)
        cand["logit"] = np.ctypeslib.as_array(ptr, shape=(n,))
        cand["p"] = 0.0
        cur = L.llama_token_data_array(
            data=ctypes.cast(cand.ctypes.data, L.llama_token_data_p), size=n, selected=-1,
            sorted=False)
        L.llama_sampler_apply(self.ptr, ctypes.byref(cur))
        if not 0 <= cur.selected < cur.size:
            raise RuntimeError("llama.cpp's sampler chain selected no token")
        # the samplers may point `data` elsewhere (a sorted copy) and keep fewer candidates
        address = ctypes.cast(cur.data, ctypes.c_void_p).value or 0
        raw = (ctypes.c_char * (cur.size * _TOKEN_DATA.itemsize)).from_address(address)
        left = np.frombuffer(raw, dtype=_TOKEN_DATA)  # type: ignore[call-overload]
        token = int(left["id"][cur.selected])
        processed = np.full(n, -np.inf)
        processed[left["id"]] = left["logit"]
        L.llama_sampler_accept(self.ptr, token)
        return token, processed

    def free(self) -> None:
        if self.ptr:
            L.llama_sampler_free(self.ptr)
            self.ptr = None

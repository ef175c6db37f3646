"""llama.cpp's own server (`llama-server`), token in / token out: `POST /completion`.

Written from the llama.cpp sources llama-cpp-python 0.3.36 vendors (tools/server) and checked
against that server built from them (docs/engines.md). Its conventions, translated here:
- the prompt is a token array (used as is: no BOS added); `return_tokens` and each stream
  chunk's `tokens` carry the sampled ids, the end-of-generation id included: a sampled id that
  ends the output (EOG, or a request's stop id, which llama-server has no field for) becomes
  the `FinishEvent`'s stop token, and the stream is closed there, which cancels the slot;
- the sampler chain is named (`samplers`), so it is exactly ours: `temperature` alone for
  greedy, `temperature` then `top_p` then the seeded draw otherwise, none of llama-server's
  own defaults (top-k 40, min-p 0.05, ...) in between;
- `n_probs` gives raw (pre-sampling) logprobs with ids, one entry per chunk;
- `timings_per_token` puts `timings.cache_n` (prompt tokens its slot cache served) on the first
  chunk: the finish event's `cached_tokens`;
- a JSON schema goes as `json_schema` (llama-server converts it; what its converter would drop
  is refused by name first), a client's grammar as `grammar` (GBNF), tool calls as GBNF
  (engines/grammars/gbnf.py), a lazy one with `grammar_lazy` and `grammar_triggers`
  (`{"type": 1, "value": word}`, type 1 being COMMON_GRAMMAR_TRIGGER_TYPE_WORD);
- fields whose llama-server meaning differs are refused by name: penalties (it counts the
  prompt too; OpenAI's count the output only), `ignore_eos` (it bans EOG ids instead of
  sampling past them), prompt logprobs (it has none);
- the context per sequence is the slot's (`/props` `n_ctx`), not the `-c` total.
For output identical to the embedded engine, run both with the same flash-attention mode and
threads (llama.cpp's defaults on both sides: `auto`, all cores): llama.cpp's CPU flash attention
changes the numerics. llama-server cannot salt its prompt cache: a request with `cache_salt`
does not reuse it (`cache_prompt: false`); what it leaves cached, a later unsalted request may
still reuse (one-way isolation, docs/engines.md).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from ..errors import ContextLengthExceededError, TokenwireError, UnsupportedParameterError
from .base import EngineEvent, EngineInfo, FinishEvent, SamplingParams, TokenEvent
from .grammars.gbnf import tags_gbnf
from .grammars.upstream import check_schema, llama_server_drops
from .upstream import (
    ChunkDecoder,
    Replica,
    UpstreamEngine,
    UpstreamInfo,
    UpstreamStatusError,
    upstream_error,
)

__all__ = ["LlamaServerEngine"]


class _LlamaServerDecoder(ChunkDecoder):
    def __init__(self, params: SamplingParams, stops: frozenset[int]):
        self._params = params
        self._stops = stops
        self._cached: int | None = None

    def feed(self, chunk: dict[str, Any]) -> list[EngineEvent]:
        cached = (chunk.get("timings") or {}).get("cache_n")
        if self._cached is None and isinstance(cached, int):
            self._cached = cached  # prompt tokens its slot's cache served
        k = self._params.logprobs
        probs = chunk.get("completion_probabilities") or []
        events: list[EngineEvent] = []
        for j, t in enumerate(chunk.get("tokens") or []):
            ev = TokenEvent(t)
            if k is not None and j < len(probs):
                p = probs[j]
                top = tuple((int(e["id"]), float(e["logprob"]))
                            for e in p.get("top_logprobs") or [])[:k]
                ev = TokenEvent(t, float(p["logprob"]), top)
            if self._params.max_tokens == 0:  # llama-server samples one token anyway
                return [FinishEvent("length", cached_tokens=self._cached)]
            if t in self._stops:
                return [*events, FinishEvent("stop", stop_token=ev,
                                             cached_tokens=self._cached)]
            events.append(ev)
        if chunk.get("stop"):
            # "eos" was handled with its token; "limit": n_predict or the slot is full
            events.append(FinishEvent("length" if chunk.get("stop_type") == "limit"
                                      else "stop", cached_tokens=self._cached))
        return events


class LlamaServerEngine(UpstreamEngine):
    name = "llama-server"

    async def describe(self, replica: Replica) -> UpstreamInfo:
        props = await self.get_json(replica, "/props")
        n_ctx = props.get("default_generation_settings", {}).get("n_ctx")
        if not isinstance(n_ctx, int):
            raise ValueError("its /props has no default_generation_settings.n_ctx")
        models = await self.get_json(replica, "/v1/models")
        name = str((models.get("data") or [{}])[0].get("id") or props.get("model_alias"))
        return UpstreamInfo(model=name, max_model_len=n_ctx,
                            mode=f"{props.get('total_slots', '?')} slots")

    def engine_info(self, first: UpstreamInfo) -> EngineInfo:
        return dataclasses.replace(super().engine_info(first), supports_prompt_logprobs=False)

    @property
    def logprobs_mode(self) -> str | None:
        """`n_probs` without `post_sampling_probs`: the raw distribution's."""
        return "raw_logprobs"

    async def tokenize(self, replica: Replica, texts: Sequence[str]) -> list[list[int]] | None:
        got = await self.tokenize_each(replica, texts, "/tokenize", lambda t: {
            "content": t, "add_special": False, "parse_special": True})
        if got is None:  # every llama-server has one: a failure is a failure
            raise UpstreamStatusError(500, replica.url + "/tokenize")
        return got

    def protocol_error(self, status: int, body: Any, where: str) -> TokenwireError:
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict) and err.get("type") == "exceed_context_size_error":
            return ContextLengthExceededError(f"upstream {where}: {err.get('message')}",
                                              param="prompt")
        return upstream_error(status, body, where)

    def request(self, replica: Replica, prompt: Sequence[int],
                params: SamplingParams) -> tuple[str, dict[str, Any]]:
        if params.presence_penalty or params.frequency_penalty:
            raise UnsupportedParameterError(
                "llama-server counts prompt tokens in its penalties (OpenAI's count the output "
                "only), so they are not offered on this model",
                param="presence_penalty" if params.presence_penalty else "frequency_penalty")
        if params.ignore_eos:
            raise UnsupportedParameterError(
                "llama-server bans end-of-generation ids instead of sampling past them",
                param="ignore_eos")
        if params.prompt_logprobs is not None:
            raise UnsupportedParameterError("llama-server cannot score prompt tokens",
                                            param="prompt_logprobs")
        if params.min_tokens:
            raise UnsupportedParameterError("llama-server has no minimum output length",
                                            param="min_tokens")
        greedy = params.temperature <= 0
        # our chain's order (engines/llamacpp/model.py `Sampler`); the logit bias always goes first
        samplers = ["penalties"] if params.repetition_penalty != 1.0 else []
        samplers.append("temperature")
        if not greedy:
            samplers += ["min_p", "top_k", "top_p"]
        body: dict[str, Any] = {
            "prompt": list(prompt),
            "n_predict": max(1, params.max_tokens),
            "temperature": 0.0 if greedy else params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "min_p": params.min_p,
            # its penalties take the prompt too, as vLLM's repetition penalty does
            "repeat_penalty": params.repetition_penalty,
            "repeat_last_n": len(prompt) + max(1, params.max_tokens),
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "logit_bias": [[t, b] for t, b in params.logit_bias],
            "samplers": samplers,
            "stream": True,
            "return_tokens": True,
            "cache_prompt": params.cache_salt is None,
            "timings_per_token": True,  # the first chunk says how much of the prompt was cached
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if params.logprobs is not None:
            body["n_probs"] = max(1, params.logprobs)  # 0 would send no logprob at all
        g = params.grammar
        if g is not None and g.json_schema is not None:
            check_schema(g, llama_server_drops)
            body["json_schema"] = json.loads(g.json_schema)
        elif g is not None:
            body["grammar"] = g.gbnf if g.gbnf is not None else tags_gbnf(g)
            if g.lazy:
                # type 1: a trigger word (the grammar holds from the word on, word included);
                # a word that is one token must also be a preserved token
                body["grammar_lazy"] = True
                body["grammar_triggers"] = [{"type": 1, "value": w} for w in g.triggers]
                body["preserved_tokens"] = list(g.triggers)
        return "/completion", body

    def decoder(self, replica: Replica, prompt: Sequence[int],
                params: SamplingParams) -> ChunkDecoder:
        return _LlamaServerDecoder(params, params.stops(self.info.eog_ids))

"""SGLang, token in / token out: `POST /generate` with `input_ids`.

Written from SGLang's source (v0.5.23: `srt/managers/io_struct.py` GenerateReqInput,
`srt/sampling/sampling_params.py`, `srt/entrypoints/http_server.py`; docs/engines.md lists what
was checked how). SGLang's conventions, translated here and nowhere else:
- `output_ids` end with the matched stop id (`meta_info.finish_reason` =
  `{"type": "stop", "matched": id}`): it becomes the `FinishEvent`'s stop token;
- stream chunks are cumulative by default and deltas with `--incremental-streaming-output`:
  either way the new ids are the last `completion_tokens - seen` of `output_ids`, so both work;
- logprobs are `[logprob, id, text]` triples in `meta_info.output_token_logprobs` /
  `output_top_logprobs` (and `input_*` for the prompt, requested unstreamed);
- the seed is `sampling_seed`, honoured only by a server started with
  `--enable-deterministic-inference` (read from `/server_info`): elsewhere a seeded request is
  refused by name rather than silently sampled with another seed;
- `max_new_tokens` is always sent (its default is 128), and the sampler fields SGLang would
  otherwise default are sent neutral.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidRequestError, ServiceUnavailableError, UnsupportedParameterError
from .base import (
    EngineEvent,
    FinishEvent,
    PromptLogprobsEvent,
    SamplingParams,
    TokenEvent,
)
from .upstream import ChunkDecoder, Replica, UpstreamEngine, UpstreamInfo, structural_tag

__all__ = ["SGLangEngine"]

_DETERMINISTIC = "deterministic"


def _top(rows: Any, k: int) -> tuple[tuple[int, float], ...]:
    """`[[logprob, id, text], ...]` -> the k most likely (id, logprob)."""
    cands = [(int(r[1]), float(r[0])) for r in rows or [] if r and r[0] is not None]
    return tuple(sorted(cands, key=lambda e: -e[1])[:k])


class _Decoder(ChunkDecoder):
    def __init__(self, prompt: Sequence[int], params: SamplingParams, stops: frozenset[int]):
        self._prompt = prompt
        self._params = params
        self._stops = stops
        self._seen = 0

    def feed(self, chunk: dict[str, Any]) -> list[EngineEvent]:
        meta = chunk.get("meta_info") or {}
        events: list[EngineEvent] = []
        if self._params.prompt_logprobs is not None and "input_token_logprobs" in meta:
            events.append(self._scored(meta))
        out_ids = list(chunk.get("output_ids") or [])
        total = meta.get("completion_tokens", len(out_ids))
        new = max(0, total - self._seen)
        ids = out_ids[len(out_ids) - new:] if new else []
        self._seen = total
        tokens = [TokenEvent(t) for t in ids]
        if self._params.logprobs is not None:
            lps = (meta.get("output_token_logprobs") or [])[-new:] if new else []
            tops = (meta.get("output_top_logprobs") or [])[-new:] if new else []
            k = self._params.logprobs
            tokens = [TokenEvent(t, float(lps[j][0]) if j < len(lps) and lps[j][0] is not None
                                 else None, _top(tops[j] if j < len(tops) else None, k))
                      for j, t in enumerate(ids)]
        finish = meta.get("finish_reason")
        if self._params.max_tokens == 0:
            tokens = []
        if isinstance(finish, dict):
            kind = finish.get("type")
            if kind == "abort":
                status = finish.get("status_code")
                message = f"SGLang aborted the request: {finish.get('message')}"
                if isinstance(status, int) and 400 <= status < 500 and status != 429:
                    raise InvalidRequestError(message, code="upstream_rejected")
                raise ServiceUnavailableError(message)
            stop_token = None
            if kind == "stop" and tokens and tokens[-1].token_id in self._stops:
                stop_token = tokens.pop()
            events += tokens
            events.append(FinishEvent("length" if kind == "length" or self._params.max_tokens
                                      == 0 else "stop", stop_token=stop_token))
            return events
        return events + tokens

    def _scored(self, meta: dict[str, Any]) -> PromptLogprobsEvent:
        k = self._params.prompt_logprobs or 0
        values = meta.get("input_token_logprobs") or []
        tops = meta.get("input_top_logprobs") or []
        entries = []
        for pos in range(1, len(self._prompt)):
            v = values[pos][0] if pos < len(values) and values[pos] else None
            entries.append(TokenEvent(self._prompt[pos], None if v is None else float(v),
                                      _top(tops[pos] if pos < len(tops) else None, k)))
        return PromptLogprobsEvent(tuple(entries))


class SGLangEngine(UpstreamEngine):
    name = "sglang"
    health_path = "/v1/models"  # SGLang's /health runs a generation: busy replicas time out

    async def describe(self, replica: Replica) -> UpstreamInfo:
        card = await self.model_card(replica)
        length = card.get("max_model_len")
        if not isinstance(length, int):
            raise ValueError("its /v1/models card has no max_model_len")
        status, info = await self.call(replica, "GET", "/server_info")
        if status != 200 or not isinstance(info, dict):
            info = {}
        mode = _DETERMINISTIC if info.get("enable_deterministic_inference") else ""
        return UpstreamInfo(model=str(card["id"]), max_model_len=length, mode=mode)

    async def tokenize(self, replica: Replica, texts: Sequence[str]) -> list[list[int]] | None:
        # None without a tokenize endpoint (before PR #9545) or with --skip-tokenizer-init
        return await self.tokenize_each(replica, texts, "/tokenize", lambda t: {
            "model": self.model_name, "prompt": t, "add_special_tokens": False})

    def protocol_error(self, status: int, body: Any, where: str):  # type: ignore[no-untyped-def]
        # SGLang's pydantic failures are flat: {"object": "error", "message", "code", ...}
        if isinstance(body, dict) and "error" not in body and "message" in body:
            body = {"error": body}
        return super().protocol_error(status, body, where)

    def request(self, replica: Replica, prompt: Sequence[int],
                params: SamplingParams) -> tuple[str, dict[str, Any]]:
        assert replica.info is not None
        sampling: dict[str, Any] = {
            "max_new_tokens": max(1, params.max_tokens),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k or -1,
            "min_p": params.min_p,
            "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty,
            "repetition_penalty": 1.0,
            "min_new_tokens": params.min_tokens,
            "stop_token_ids": sorted(params.stops(self.info.eog_ids)),
            "ignore_eos": params.ignore_eos,
            "skip_special_tokens": False,
            "no_stop_trim": True,
            "n": 1,
        }
        if params.repetition_penalty != 1.0:
            # penaltylib/repetition_penalty.py: SGLang's counts the output only, vLLM's (the
            # field's meaning here) the prompt too
            raise UnsupportedParameterError(
                "SGLang's repetition penalty counts only the output, not the prompt as "
                "vLLM's does", param="repetition_penalty")
        if params.logit_bias:
            sampling["logit_bias"] = {str(t): b for t, b in params.logit_bias}
        if params.ignore_eos and params.stop_token_ids:
            # SGLang's token-based finish returns early under ignore_eos: stop ids would not stop
            raise UnsupportedParameterError(
                "SGLang does not stop on stop ids under ignore_eos", param="ignore_eos")
        if params.seed is not None and params.temperature > 0:
            if replica.info.mode != _DETERMINISTIC:
                raise UnsupportedParameterError(
                    "this SGLang upstream ignores seeds (it runs without "
                    "--enable-deterministic-inference)", param="seed")
            sampling["sampling_seed"] = params.seed
        g = params.grammar
        if g is not None and g.lazy:
            sampling["structural_tag"] = structural_tag(g)
        elif g is not None:
            sampling["ebnf"] = g.gbnf  # xgrammar's EBNF reads GBNF
        body: dict[str, Any] = {"input_ids": list(prompt), "sampling_params": sampling,
                                "stream": params.prompt_logprobs is None}
        if params.cache_salt is not None:
            body["cache_salt"] = params.cache_salt
        if params.logprobs is not None or params.prompt_logprobs is not None:
            body["return_logprob"] = True
            body["top_logprobs_num"] = max(params.logprobs or 0, params.prompt_logprobs or 0)
            body["logprob_start_len"] = 0 if params.prompt_logprobs is not None else -1
        return "/generate", body

    def decoder(self, replica: Replica, prompt: Sequence[int],
                params: SamplingParams) -> ChunkDecoder:
        return _Decoder(prompt, params, params.stops(self.info.eog_ids))

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
  otherwise default are sent neutral;
- an abort finish (`{"type": "abort", ...}`) with a `status_code` is a refusal (4xx) or a
  timeout (503); one without (`FINISH_ABORT()` of a running request, "Abort in waiting queue"
  of a queued one: what `pause_generation` in `abort` mode and `/abort_request` send) ends
  the output with vLLM's finish reason "abort", its tokens kept;
- finished outputs' `meta_info.weight_versions` are vLLM's spans already (`[{version, start,
  end}]` over output indexes, the stop id's included): passed on;
- the control plane (vLLM's RL endpoints) maps to SGLang's own (`_control_request`, read in
  `srt/entrypoints/http_server.py` and `io_struct.py` of 0.5.23): `pause` to
  `/pause_generation` (`abort`, and `keep` as `in_place`; vLLM's draining `wait` has no SGLang
  mode and is refused by name), `resume` to `/continue_generation`, `update_weight_version`
  (without SGLang's default abort of every request), `weight_info` to `/model_info`,
  `reset_prefix_cache` to `/flush_cache`, new weights from disk (`update_info.weights_path`,
  or `collective_rpc` `reload_weights`) to `/update_weights_from_disk`, `sleep`/`wake_up` to
  `/release_memory_occupation`/`/resume_memory_occupation`; the rest (no SGLang counterpart:
  `is_paused`, `is_sleeping`, the NCCL transfer calls) is refused by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ..errors import InvalidRequestError, ServiceUnavailableError, UnsupportedParameterError
from .base import (
    ControlCall,
    EngineEvent,
    FinishEvent,
    PromptLogprobsEvent,
    SamplingParams,
    TokenEvent,
    WeightSpan,
)
from .grammars.upstream import check_schema, xgrammar_drops
from .grammars.xgrammar import structural_tag
from .upstream import ChunkDecoder, Replica, UpstreamEngine, UpstreamInfo

__all__ = ["SGLangEngine"]

_DETERMINISTIC = "deterministic"


def _top(rows: Any, k: int) -> tuple[tuple[int, float], ...]:
    """`[[logprob, id, text], ...]` -> the k most likely (id, logprob)."""
    cands = [(int(r[1]), float(r[0])) for r in rows or [] if r and r[0] is not None]
    return tuple(sorted(cands, key=lambda e: -e[1])[:k])


class _SglangDecoder(ChunkDecoder):
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
            status = finish.get("status_code")
            if kind == "abort" and status is not None:  # a refusal, or an SLA timeout (503)
                message = f"SGLang aborted the request: {finish.get('message')}"
                if isinstance(status, int) and 400 <= status < 500 and status != 429:
                    raise InvalidRequestError(message, code="upstream_rejected")
                raise ServiceUnavailableError(message)
            stop_token = None
            if kind == "stop" and tokens and tokens[-1].token_id in self._stops:
                stop_token = tokens.pop()
            events += tokens
            spans = meta.get("weight_versions")
            # an abort without a status is an operator's (pause_generation's abort mode,
            # /abort_request): vLLM's finish reason "abort", what was sampled kept
            reason: Literal["stop", "length", "abort"] = "abort" if kind == "abort" \
                else "length" if kind == "length" or self._params.max_tokens == 0 else "stop"
            events.append(FinishEvent(reason, stop_token=stop_token, weight_versions=tuple(
                WeightSpan(str(w["version"]), int(w["start"]), int(w["end"]))
                for w in spans) if isinstance(spans, list) and spans else None))
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


_PAUSE_MODES = {"abort": "abort", "keep": "in_place"}
"""vLLM's pause modes -> SGLang's (`PauseGenerationReqInput.mode`)."""


def _disk_path(call: ControlCall) -> str:
    """The checkpoint a weight update names (vLLM's `collective_rpc` `reload_weights`, or
    tokenwire's from-disk `update_info`)."""
    body = call.body if isinstance(call.body, dict) else {}
    if call.op == "collective_rpc":
        if body.get("method") != "reload_weights":
            raise UnsupportedParameterError(
                f"collective_rpc method {body.get('method')!r}: SGLang has no vLLM workers; "
                "reload_weights (kwargs.weights_path) maps to its /update_weights_from_disk",
                param="method")
        path, param = (body.get("kwargs") or {}).get("weights_path"), "kwargs.weights_path"
    else:
        path, param = (body.get("update_info") or {}).get("weights_path"), \
            "update_info.weights_path"
    if not isinstance(path, str) or not path:
        raise InvalidRequestError(
            f"{param}: SGLang loads new weights from disk (/update_weights_from_disk): name "
            "the checkpoint directory on its machine", param=param)
    return path


class SGLangEngine(UpstreamEngine):
    name = "sglang"
    health_path = "/v1/models"  # SGLang's /health runs a generation: busy replicas time out

    def control_request(self, call: ControlCall) -> tuple[str, str, Any]:
        body = call.body if isinstance(call.body, dict) else {}
        op = call.op
        if op == "pause":
            mode = dict(call.query).get("mode", "abort")
            if mode not in _PAUSE_MODES:
                raise UnsupportedParameterError(
                    f"pause?mode={mode}: SGLang has no draining pause (its modes are abort, "
                    "retract and in_place); pause with mode=abort or mode=keep", param="mode")
            return "POST", "/pause_generation", {"mode": _PAUSE_MODES[mode]}
        if op == "resume":
            return "POST", "/continue_generation", {}
        if op in ("update_weight_version", "finish_weight_update"):
            key = "new_version" if op == "update_weight_version" else "weight_version"
            version = body.get(key)
            if not isinstance(version, str) or not version:
                raise InvalidRequestError(f"{key} must be a non-empty string (SGLang's "
                                          "/update_weight_version needs one)", param=key)
            # vLLM's relabels; SGLang's aborts every request unless told not to
            return "POST", "/update_weight_version", {"new_version": version,
                                                      "abort_all_requests": False}
        if op == "weight_info":
            return "GET", "/model_info", None
        if op == "reset_prefix_cache":
            return "POST", "/flush_cache", None
        if op in ("update_weights", "collective_rpc"):
            info = body.get("update_info")
            req: dict[str, Any] = {"model_path": _disk_path(call)}
            if isinstance(info, dict) and isinstance(info.get("weight_version"), str):
                req["weight_version"] = info["weight_version"]
            return "POST", "/update_weights_from_disk", req
        if op == "sleep":
            return "POST", "/release_memory_occupation", {}
        if op == "wake_up":
            return "POST", "/resume_memory_occupation", {}
        raise UnsupportedParameterError(
            f"{op} has no SGLang counterpart (its server has no {op} endpoint); the control "
            "calls SGLang upstreams take: pause (abort, keep), resume, update_weight_version, "
            "weight_info, reset_prefix_cache, update_weights and collective_rpc reload_weights "
            "(from disk), finish_weight_update, sleep, wake_up", param=op)

    def control_answer(self, call: ControlCall, status: int, body: Any) -> tuple[int, Any]:
        op = call.op
        data = body if isinstance(body, dict) else {}
        if op == "reset_prefix_cache":
            # SGLang: 400 and a text while requests run (vLLM: 200, success false)
            return (200, {"success": status == 200}) if status in (200, 400) else (status, body)
        if not 200 <= status < 300 or data.get("success") is False:
            return (status if status >= 400 else 502), body
        answers: dict[str, Any] = {
            "pause": {"status": "paused"},
            "resume": {"status": "resumed"},
            "update_weight_version": {"success": True, "new_version": data.get("new_version")},
            "finish_weight_update": {"message": "Weight update finished"},
            "weight_info": {"weight_version": data.get("weight_version")},
            "update_weights": {"message": "Weights updated"},
            "collective_rpc": {"results": [None]},
            "sleep": {"status": "sleeping", "level": 1},
            "wake_up": {"status": "awake", "tags": None},
        }
        return status, answers.get(op, body)

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
        if g is not None:  # in SGLang's terms, for xgrammar (which drops some keywords)
            check_schema(g, xgrammar_drops)
            if g.json_schema is not None:
                sampling["json_schema"] = g.json_schema
            elif g.gbnf is not None:
                sampling["ebnf"] = g.gbnf  # xgrammar's EBNF reads GBNF
            else:
                sampling["structural_tag"] = structural_tag(g)
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
        return _SglangDecoder(prompt, params, params.stops(self.info.eog_ids))

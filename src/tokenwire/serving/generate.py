"""POST /inference/v1/generate: vLLM's tokens-in/tokens-out API, on any engine.

The prompt is rendered by the client (RL tooling renders chat itself), so it is a raw prompt:
it may carry the template's control ids where the deployment allows raw prompts, and it gets
the checks every id path gets (range, control ids, the content policy on its decoded text).
The response follows vLLM: `token_ids` end with the id that ended the output (EOS or a stop
id), `stop_reason` is that id (None for the model's main EOS) or the stop string, and a stream
sends one event per choice and step, then usage, then `[DONE]`.

`store: true` (tokenwire's, as chat's) keeps the rollout as a stored completion
(`generate-tokens-<request_id>`): the prompt ids, each choice's sampled ids and the id that
ended it, the request and the response as they went out (a stream: as the same request
unstreamed would have answered), durable before the client hears that a choice finished.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..config import Settings
from ..engines.base import Grammar, TokenEvent, TokenRun, WeightSpan
from ..errors import InvalidRequestError, TokenwireError, UnsupportedParameterError
from ..metrics import Metrics
from ..protocol._base import RawJSON
from ..protocol.common import Usage
from ..protocol.generate import (
    GenerateChoice,
    GenerateLogprob,
    GenerateLogprobs,
    GenerateRequest,
    GenerateResponse,
    GenerateStreamResponse,
    StructuredOutputs,
)
from ..storage import StoredCompletion
from ..tokenizers.registry import TokenizerRegistry
from . import structured
from .generation import (
    ChoiceResult,
    Choices,
    ChoiceUpdate,
    Family,
    RunningUsage,
    StreamedResponse,
    Totals,
    migration_warnings,
    run_choices,
    wire_spans,
)
from .guard import Guard
from .logprobs import generate_logprobs_json, prompt_logprob_rows
from .models import ModelRegistry, ServedModel
from .sampling_params import choice_params, completion_budget, vllm_params, weight_bound
from .service import (
    ANONYMOUS,
    Caller,
    GenerationService,
    Plan,
    check_engine_features,
    check_sampling_mask,
)
from .stored_completions import StoredCompletions, stops_of
from .tokens import IdSpan, check_id_range, resolve_token_space

__all__ = ["GenerateService"]

E = TypeVar("E")


def _refuse_unsupported(model: object, prefix: str) -> None:
    for name, neutral in type(model).unsupported.items():  # type: ignore[attr-defined]
        if getattr(model, name) not in neutral:
            raise UnsupportedParameterError(f"'{prefix}{name}' is not supported by this server",
                                            param=f"{prefix}{name}")


def _grammar(so: StructuredOutputs | None, model: ServedModel) -> Grammar | None:
    """vLLM's structured outputs, as far as they are honoured: a schema, any JSON object, or a
    GBNF grammar (one of them)."""
    if so is None:
        return None
    param = "sampling_params.structured_outputs"
    _refuse_unsupported(so, f"{param}.")
    given = [k for k, v in (("json", so.json_), ("grammar", so.grammar),
                            ("json_object", so.json_object),
                            ("structural_tag", so.structural_tag)) if v not in (None, False)]
    if len(given) != 1:
        raise InvalidRequestError("structured_outputs needs exactly one of json, json_object, "
                                  "grammar and structural_tag", param=param,
                                  code="invalid_value")
    if not model.engine.info.supports_grammar:
        raise UnsupportedParameterError(
            f"model {model.id!r} cannot constrain its output (no grammar support)",
            param=param)
    if so.grammar is not None:
        return Grammar(gbnf=so.grammar, param=f"{param}.grammar")
    if so.structural_tag is not None:
        if not model.engine.info.supports_lazy_grammar:
            raise UnsupportedParameterError(
                f"model {model.id!r} cannot follow a lazy grammar",
                param=f"{param}.structural_tag")
        return _structural_tag(so.structural_tag, f"{param}.structural_tag")
    if so.json_object:
        return structured.json_object(f"{param}.json_object")
    schema = so.json_
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(f"json is not a JSON schema: {exc}",
                                      param=f"{param}.json", code="invalid_value") from exc
    return structured.schema(schema, f"{param}.json")


def _structural_tag(text: str, param: str) -> Grammar:
    try:
        tag = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"structural_tag is not JSON: {exc}", param=param,
                                  code="invalid_value") from exc
    return structured.from_structural_tag(tag, param)


@dataclass(kw_only=True)
class _Plan(Plan):
    req: GenerateRequest
    grammar: Grammar | None = None
    stop_at_end: bool = False
    """TGI's stop rule (serving/output.py), for TGI's API on this engine call."""

    @property
    def prompt(self) -> list[int]:
        return self.req.token_ids

    def usage(self, t: Totals) -> Usage:
        """vLLM's usage, with `prompt_tokens_details.cached_tokens` where the engine says."""
        return Usage.of(len(self.prompt), t.sampled, t.cached.get(0))

    def choice(self, index: int, ids: list[int], events: Sequence[TokenEvent],
                finish: str | None, stop_reason: int | str | None,
                stop_event: TokenEvent | None,
                weights: tuple[WeightSpan, ...] | None = None,
                experts: str | None = None) -> GenerateChoice:
        ended: list[TokenEvent] = []
        if stop_event is not None:  # vLLM's ids end with the id that ended the output
            ids = [*ids, stop_event.token_id]
            ended = [stop_event]
            if stop_event.token_id == self.model.tokenizer_entry.eos_id:
                stop_reason = None  # vLLM: the model's main EOS has no stop_reason
        lp = None
        if self.req.sampling_params.logprobs is not None:
            lp = GenerateLogprobs(content=RawJSON.array(
                generate_logprobs_json(events) + generate_logprobs_json(ended)))
        masks = [] if isinstance(events, TokenRun) else \
            [list(e.sampling_mask) for e in [*events, *ended] if e.sampling_mask is not None]
        return GenerateChoice(index=index, finish_reason=finish, stop_reason=stop_reason,
                              token_ids=ids, logprobs=lp, weight_versions=wire_spans(weights),
                              sampling_mask=masks if masks and len(masks) == len(ids) else None,
                              routed_experts=experts)

    def envelope(self) -> dict[str, object]:
        return {"request_id": self.id, "tokenizer_version": self.space.client.version,
                "token_ids_source": self.source, "logprobs_mode": self.logprobs_mode}

    def first(self) -> dict[str, object]:
        """What only the first event (or the whole response) carries."""
        return {"warnings": self.warnings,
                "prompt_token_ids": self.prompt if self.req.return_token_ids else None}


class GenerateService(GenerationService):
    def __init__(self, models: ModelRegistry, tokenizers: TokenizerRegistry, settings: Settings,
                 guard: Guard, metrics: Metrics, *, stored: StoredCompletions | None = None):
        super().__init__(models, tokenizers, settings, guard, metrics)
        self.stored = stored
        """Without a store (None), `store` is refused."""

    def plan(self, req: GenerateRequest, caller: Caller = ANONYMOUS, *,
             text_prompt: bool = False, own_prefix: int = 0,
             stop_at_end: bool = False) -> _Plan:
        """`text_prompt`: the ids are the server's encoding of the client's text (an API that
        takes text, TGI's); `own_prefix`: the first that many ids are the server's own (the BOS
        its tokenizer adds to text), not checked as the client's; `stop_at_end`: TGI's stop
        rule."""
        sp = req.sampling_params
        _refuse_unsupported(req, "")
        _refuse_unsupported(sp, "sampling_params.")
        if sp.n > self._settings.max_n:
            raise InvalidRequestError(f"n must be at most {self._settings.max_n}",
                                      param="sampling_params.n", code="invalid_value")
        if req.stream_options is not None and not req.stream:
            raise InvalidRequestError("stream_options is only allowed when stream is true",
                                      param="stream_options", code="invalid_value")
        if sp.prompt_logprobs is not None and req.stream:
            # vLLM sends prompt logprobs in whole responses only
            raise InvalidRequestError("prompt_logprobs are returned by non-streaming requests",
                                      param="sampling_params.prompt_logprobs",
                                      code="invalid_value")
        model = self._models.get(req.model) if req.model else self._models.only()
        check_engine_features(model, logprobs=sp.logprobs is not None,
                              prompt_logprobs=sp.prompt_logprobs is not None,
                              prompt_param="sampling_params.prompt_logprobs")
        check_sampling_mask(model, temperature=sp.temperature, top_k=sp.top_k,
                            prefix="sampling_params.")
        grammar = _grammar(sp.structured_outputs, model)
        # the vLLM dialect: ids without a version mean the model's own
        space = resolve_token_space(
            target=model.tokenizer_entry, target_name=f"model {model.id!r}",
            registry=self._tokenizers, version=req.tokenizer_version, fallback="error",
            carries_ids=True, require_version=False)
        tok = space.client.tokenizer
        spans = [IdSpan("token_ids", req.token_ids[own_prefix:])]
        check_id_range([*spans, IdSpan("sampling_params.stop_token_ids",
                                       sp.stop_token_ids or [])], tok)
        warnings = self._guard.check_ids(spans, tok, raw_prompt=True, caller_key=caller.api_key,
                                         encoded=text_prompt)
        self._guard.check_prompts([("token_ids", req.token_ids)], tok, "token_ids")
        return _Plan(req=req, model=model, space=space, shows_ids=True,
                     sent_ids=not text_prompt, grammar=grammar, stop_at_end=stop_at_end,
                     logprobs_mode=model.engine.info.logprobs_mode
                     if sp.logprobs is not None else None,
                     id=f"generate-tokens-{req.request_id or uuid.uuid4().hex}",
                     warnings=warnings or None)

    async def _start(self, plan: _Plan, *, whole: bool = False) -> Choices:
        sp = plan.req.sampling_params
        # vLLM's rule: more tokens asked than the context leaves end in "length", not a 400
        # (RL loops send a fixed max_tokens with prompts that grow turn by turn)
        room = plan.model.max_model_len - len(plan.prompt)
        requested = min(sp.max_tokens, room) if sp.max_tokens is not None and room > 0 \
            else sp.max_tokens
        budget = completion_budget(
            prompt_len=len(plan.prompt), max_model_len=plan.model.max_model_len,
            requested=requested, prompt_param="token_ids",
            limit_param="sampling_params.max_tokens", cap=self._settings.max_tokens_limit)
        params = choice_params(
            n=sp.n, max_tokens=budget, temperature=sp.temperature, top_p=sp.top_p,
            seed=None if sp.seed == -1 else sp.seed,  # vLLM: -1 is no seed
            logprobs=sp.logprobs, presence_penalty=sp.presence_penalty,
            frequency_penalty=sp.frequency_penalty, prompt_logprobs=sp.prompt_logprobs,
            grammar=plan.grammar,
            extras=vllm_params(sp, sp.logit_bias, vocab_size=plan.model.tokenizer.vocab_size,
                               budget=budget, cache_salt=plan.req.cache_salt,
                               weight_bound=weight_bound(plan.req, self._settings),
                               adapter=plan.model.adapter,
                               prefix="sampling_params."))
        return await run_choices(plan.model.engine, [(plan.prompt, p) for p in params],
                                 plan.model.tokenizer, sp.stop or (), token_aligned=True,
                                 keep_stop_token=True, min_tokens=sp.min_tokens,
                                 text=None,  # the response has ids only
                                 output_check=self._guard.output_check(),
                                 timer=self._timer(plan), whole=whole,
                                 coalesce=self._coalesce(plan.req.stream_options),
                                 stop_at_end=plan.stop_at_end)

    async def create(self, req: GenerateRequest, caller: Caller = ANONYMOUS) -> GenerateResponse:
        await self._check_store(req, caller)
        plan = await self._prepare(self.plan, req, caller)
        acc = await self._whole(lambda: self._start(plan, whole=True), req.sampling_params.n)
        response = _response(plan, acc, self._count(plan, Totals.of(acc)))
        if req.store:
            await self._keep(plan, response, acc, caller)
        return response

    async def planned(self, req: GenerateRequest, caller: Caller = ANONYMOUS, *,
                      text_prompt: bool = False, own_prefix: int = 0,
                      stop_at_end: bool = False) -> Plan:
        """The request checked and planned, nothing run yet (an API that answers later, as
        Tinker's futures do, refuses bad input before it answers); the options are `plan`'s,
        for an API whose prompt is text or whose stop rule is TGI's."""
        return await self._prepare(self.plan, req, caller, text_prompt=text_prompt,
                                   own_prefix=own_prefix, stop_at_end=stop_at_end)

    async def finished(self, plan: Plan) -> list[ChoiceResult]:
        """A planned request's choices, whole: the same engine call as `create`'s, for an
        API that writes its own answer (Tinker's `SampleResponse`)."""
        assert isinstance(plan, _Plan)
        acc = await self._whole(lambda: self._start(plan, whole=True),
                                plan.req.sampling_params.n)
        self._count(plan, Totals.of(acc))
        return acc

    async def streamed(self, plan: Plan, family: Family[E]) -> StreamedResponse[E]:
        """A planned request's choices as they come, made into `family`'s events: the same
        engine call as `stream`'s, for an API that writes its own events (TGI's)."""
        assert isinstance(plan, _Plan)
        return self._stream(plan, family, await self._start(plan))

    async def stream(self, req: GenerateRequest, caller: Caller = ANONYMOUS,
                     ) -> StreamedResponse[GenerateStreamResponse]:
        await self._check_store(req, caller)
        plan = await self._prepare(self.plan, req, caller)

        async def keep(whole: list[ChoiceResult], usage: Usage) -> None:
            await self._keep(plan, _response(plan, whole, usage), whole, caller)

        return self._stream(plan, _GenerateEvents(plan, keep if req.store else None),
                            await self._start(plan))

    # -- store: true ----------------------------------------------------------------------------

    async def _check_store(self, req: GenerateRequest, caller: Caller) -> None:
        """`store` on a server that keeps records, with a `request_id` no record has; before
        any work is done (the insert is still the arbiter between gateways)."""
        if not req.store:
            return
        if self.stored is None:
            raise UnsupportedParameterError("this server keeps no records (no storage)",
                                            param="store")
        if req.request_id is not None:
            if "\x00" in req.request_id:
                raise InvalidRequestError("a stored completion's id cannot hold NUL characters",
                                          param="request_id")
            await self.stored.check_free(f"generate-tokens-{req.request_id}", caller)

    async def _keep(self, plan: _Plan, response: GenerateResponse,
                    acc: Sequence[ChoiceResult], caller: Caller) -> None:
        """The rollout as a stored completion: the prompt and the sampled ids (the model's:
        the token API's ids are), each choice's stop id apart from them as chat's are, the
        request as sent and the response as it went out; durable before the client hears the
        response is done."""
        assert self.stored is not None
        await self.stored.keep(StoredCompletion(
            id=plan.id, owner=caller.owner, model=plan.model.id, created=plan.created,
            tokenizer_version=plan.space.model.version, template_version=None,
            prompt_ids=plan.prompt, vocab_size=plan.model.tokenizer.vocab_size,
            request=plan.req.model_dump(mode="json", exclude_unset=True, by_alias=True),
            response=response.model_dump(mode="json"), metadata=plan.req.metadata or {},
            output_ids=[list(a.ids) for a in acc], stops=stops_of(acc), endpoint="generate"))


def _response(plan: _Plan, acc: Sequence[ChoiceResult], usage: Usage) -> GenerateResponse:
    """The whole response of a request's finished choices."""
    req = plan.req
    choices = [plan.choice(i, a.ids, a.events, a.finish_reason, a.stop_reason,
                           a.stop_event, a.weight_versions, a.routed_experts)
               for i, a in enumerate(acc)]
    scored = acc[0].prompt_logprobs if acc and req.sampling_params.prompt_logprobs is not None \
        else None
    first = plan.first()
    first["warnings"] = migration_warnings(plan.warnings, *(a.migrations for a in acc))
    return GenerateResponse(
        **plan.envelope(), **first, model=plan.model.id, created=plan.created, usage=usage,
        prompt_logprobs=prompt_logprob_rows(
            plan.prompt, scored, lambda _, lp, rank: GenerateLogprob(logprob=lp, rank=rank))
        if scored is not None
        else None,
        choices=choices)


class _GenerateEvents:
    """vLLM's stream (a `Family`): one event per choice and step, then usage. `keep`: stores
    the whole response before any choice's finishing event goes out."""

    def __init__(self, plan: _Plan,
                 keep: Callable[[list[ChoiceResult], Usage], Awaitable[None]] | None = None):
        self._plan = plan
        self._env = plan.envelope()
        self._first = plan.first()  # until the first event goes out
        self._running = RunningUsage([len(plan.prompt)] * plan.req.sampling_params.n,
                                     plan.req.stream_options)
        self._keep = keep
        n = plan.req.sampling_params.n
        self._whole = [ChoiceResult() for _ in range(n)] if keep is not None else []
        self._held: list[GenerateStreamResponse] = []  # with `keep`: each finishing event

    def start(self) -> list[GenerateStreamResponse]:
        return []

    def update(self, u: ChoiceUpdate) -> list[GenerateStreamResponse]:
        if self._keep is not None:
            self._whole[u.index].add(u)
        if not u.delta and u.finish_reason is None:
            return []  # prompt logprobs (not streamed, as in vLLM) or an empty step
        plan, first = self._plan, self._first
        choice = plan.choice(u.index, u.delta.ids, u.delta.events, u.finish_reason,
                             u.stop_reason, u.stop_event, u.weight_versions, u.routed_experts)
        self._running.add(u)
        if u.migrations:  # on the finishing event (after the first one's, if it is that)
            first = {**first, "warnings": migration_warnings(
                plan.warnings if first else None, u.migrations)}
        self._first = {}
        event = GenerateStreamResponse(**self._env, **first, choices=[choice],
                                       usage=self._running.of(u.index))
        if self._keep is not None and u.finish_reason is not None:
            self._held.append(event)
            return []
        return [event]

    async def close(self, usage: Usage) -> list[GenerateStreamResponse]:
        out: list[GenerateStreamResponse] = []
        if self._keep is not None:
            await self._keep(self._whole, usage)
            out += self._held
        opts = self._plan.req.stream_options
        if opts is not None and opts.include_usage:
            out.append(GenerateStreamResponse(**self._env, choices=[], usage=usage))
        return out

    def fail(self, exc: TokenwireError) -> None:
        return None

"""POST /v1/completions (legacy): prompts as text or ids -> choices -> response or chunks.

Several prompts run together; choice `i * n + j` is the j-th sample of prompt i (OpenAI's
order). `echo` prefixes each choice with its prompt, and with `logprobs` scores the prompt too
(the engine's prompt logprobs), which is how token sequences get scored.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from ..engines.base import TokenEvent
from ..errors import InvalidRequestError, TokenwireError, UnsupportedParameterError
from ..protocol.common import Usage, WeightVersionSpan
from ..protocol.completions import (
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionRequest,
)
from ..tokenizers.conversions import conversion_reason
from .checks import check_generation_request
from .generation import (
    Choices,
    ChoiceUpdate,
    RunningUsage,
    StreamedResponse,
    Totals,
    migration_warnings,
    run_choices,
    wire_spans,
)
from .logprobs import LegacyLogprobs
from .sampling_params import (
    choice_params,
    completion_budget,
    truncate_prompt,
    vllm_params,
    weight_bound,
)
from .service import (
    ANONYMOUS,
    Caller,
    GenerationService,
    Plan,
    check_engine_features,
    check_sampling_mask,
)
from .tokens import IdSpan, check_id_range

__all__ = ["CompletionService"]


def _prompts(req: CompletionRequest) -> list[tuple[str, str | list[int]]]:
    """Each prompt with its param path."""
    p = req.prompt
    if isinstance(p, str):
        return [("prompt", p)]
    if not p:
        raise InvalidRequestError("prompt must not be an empty array", param="prompt",
                                  code="invalid_value")
    if isinstance(p[0], int):
        return [("prompt", list(p))]
    return [(f"prompt[{i}]", x) for i, x in enumerate(p)]  # type: ignore[misc]


@dataclass(kw_only=True)
class _Plan(Plan):
    req: CompletionRequest
    params: list[str]
    prompts: list[list[int]]

    def prompt_of(self, choice: int) -> list[int]:
        return self.prompts[choice // self.req.n]

    def echo_text(self, choice: int) -> str:
        if not self.req.echo:
            return ""
        with conversion_reason("echo"):
            return self.model.tokenizer.decode(self.prompt_of(choice))

    def usage(self, t: Totals) -> Usage:
        """Each prompt counts what the prefix cache served its first choice (the others run
        the same prompt)."""
        prompt = sum(len(p) for p in self.prompts)
        firsts = [t.cached.get(i * self.req.n) for i in range(len(self.prompts))]
        known = None if any(c is None for c in firsts) else sum(c or 0 for c in firsts)
        return Usage.of(prompt, t.sampled, known)

    def prompt_events(self, choice: int, scored: tuple[TokenEvent, ...]) -> list[TokenEvent]:
        """An echoed prompt's logprob events: its first id unscored, then the engine's."""
        return [TokenEvent(self.prompt_of(choice)[0]), *scored]


class CompletionService(GenerationService):
    def plan(self, req: CompletionRequest, caller: Caller = ANONYMOUS) -> _Plan:
        check_generation_request(
            req, self._settings,
            prompt_scored="echo" if req.echo and req.logprobs is not None else None)
        if req.best_of not in (None, req.n):
            raise UnsupportedParameterError("'best_of' other than n is not supported",
                                            param="best_of")
        model = self._models.get(req.model)
        check_engine_features(model, logprobs=req.logprobs is not None,
                              prompt_logprobs=req.echo and req.logprobs is not None,
                              prompt_param="echo")
        check_sampling_mask(model, temperature=req.temperature, top_k=req.top_k)
        prompts = _prompts(req)
        if len(prompts) > self._settings.max_prompts:
            raise InvalidRequestError(f"at most {self._settings.max_prompts} prompts per "
                                      "request", param="prompt", code="invalid_value")
        spans = [IdSpan(param, p) for param, p in prompts if not isinstance(p, str)]
        space = self._space(model, req.tokenizer_version, req.tokenizer_fallback, bool(spans))
        check_id_range([*spans, IdSpan("stop_token_ids", req.stop_token_ids or [])],
                       space.client.tokenizer)
        if (req.stop_token_ids or req.logit_bias) and space.translate:
            raise UnsupportedParameterError(
                "stop_token_ids and logit_bias name the model's ids; they cannot be combined "
                "with tokenizer_fallback 'translate'",
                param="stop_token_ids" if req.stop_token_ids else "logit_bias")
        # id prompts are raw: rendered by the client, template control ids included
        warnings = self._guard.check_ids(spans, space.client.tokenizer, raw_prompt=True,
                                         caller_key=caller.api_key)
        self._guard.check_prompts(prompts, space.client.tokenizer, "prompt")
        tok = model.tokenizer
        entry = model.tokenizer_entry
        ids: list[list[int]] = []
        for param, p in prompts:
            if isinstance(p, str):
                # typed control-token strings stay text; send ids to use control tokens
                got = tok.encode(p)
                if entry.add_bos and entry.bos_id is not None:
                    got.insert(0, entry.bos_id)
            elif space.translate:
                with conversion_reason("translate"):
                    got = tok.encode(space.client.tokenizer.decode(p))
            else:
                got = list(p)
            if not got:
                raise InvalidRequestError("prompt must not be empty", param=param,
                                          code="invalid_value")
            reserve = req.max_tokens if req.max_tokens is not None \
                else self._settings.default_max_tokens
            ids.append(truncate_prompt(got, req.truncate_prompt_tokens, req.truncation_side,
                                       max_model_len=model.max_model_len, reserve=reserve))
        return _Plan(req=req, model=model, space=space, params=[p for p, _ in prompts],
                     prompts=ids, shows_ids=req.return_token_ids, sent_ids=bool(spans),
                     skip_special=bool(req.skip_special_tokens),
                     id=f"cmpl-{req.request_id or uuid.uuid4().hex}",
                     warnings=warnings or None,
                     logprobs_mode=model.engine.info.logprobs_mode
                     if req.logprobs is not None else None)

    async def _start(self, plan: _Plan, *, whole: bool = False) -> Choices:
        req = plan.req
        score = req.logprobs if req.echo else None
        jobs = []
        for param, prompt in zip(plan.params, plan.prompts, strict=True):
            budget = completion_budget(
                prompt_len=len(prompt), max_model_len=plan.model.max_model_len,
                requested=req.max_tokens, prompt_param=param, limit_param="max_tokens",
                cap=self._settings.max_tokens_limit,
                default=self._settings.default_max_tokens,
            )
            extras = vllm_params(req, req.logit_bias,
                                 vocab_size=plan.model.tokenizer.vocab_size, budget=budget,
                                 cache_salt=req.cache_salt,
                                 weight_bound=weight_bound(req, self._settings),
                                 adapter=plan.model.adapter)
            for p in choice_params(
                n=req.n, max_tokens=budget, temperature=req.temperature, top_p=req.top_p,
                seed=req.seed, logprobs=req.logprobs, presence_penalty=req.presence_penalty,
                frequency_penalty=req.frequency_penalty, prompt_logprobs=score, extras=extras,
            ):
                jobs.append((prompt, p))
        return await run_choices(plan.model.engine, jobs, plan.model.tokenizer,
                                 req.stop or (), token_aligned=req.return_token_ids,
                                 output_check=self._guard.output_check(),
                                 timer=self._timer(plan),
                                 include_stop=req.include_stop_str_in_output,
                                 skip_special=bool(req.skip_special_tokens),
                                 min_tokens=req.min_tokens, whole=whole,
                                 coalesce=self._coalesce(req.stream_options))

    async def create(self, req: CompletionRequest, caller: Caller = ANONYMOUS) -> Completion:
        plan = await self._prepare(self.plan, req, caller)
        acc = await self._whole(lambda: self._start(plan, whole=True), len(plan.prompts) * req.n)
        tok = plan.model.tokenizer
        choices = []
        for c, a in enumerate(acc):
            text = a.text
            logprobs = None
            if req.logprobs is not None:
                lp = LegacyLogprobs(tok, plan.logprob_ids())
                events = a.events
                if req.echo:
                    events = [*plan.prompt_events(c, a.prompt_logprobs), *events]
                logprobs = lp.take(events)
            choices.append(CompletionChoice(
                text=plan.echo_text(c) + text, index=c, logprobs=logprobs,
                finish_reason=a.finish_reason,
                token_ids=plan.out_ids(a.ids) if req.return_token_ids else None,
                prompt_token_ids=plan.prompt_of(c) if req.return_token_ids
                and not plan.space.translate else None,
                stop_reason=plan.stop_reason(a.stop_reason) if req.return_token_ids else None,
                weight_versions=wire_spans(a.weight_versions),
            ))
        return Completion(**plan.envelope(), choices=choices,
                          usage=self._count(plan, Totals.of(acc)),
                          warnings=migration_warnings(plan.warnings,
                                                      *(a.migrations for a in acc)))

    async def stream(self, req: CompletionRequest, caller: Caller = ANONYMOUS,
                     ) -> StreamedResponse[CompletionChunk]:
        plan = await self._prepare(self.plan, req, caller)
        return self._stream(plan, _CompletionChunks(plan), await self._start(plan))


class _CompletionChunks:
    """The chunks of one streamed completion (a `Family`): the echo (and the prompt's ids)
    first, scored echoes once their logprobs come; a chunk per update; each choice's
    finishing chunk; then usage."""

    def __init__(self, plan: _Plan):
        req = self._req = plan.req
        self._plan = plan
        self._env = plan.envelope()
        n = len(plan.prompts) * req.n
        self._lps = [LegacyLogprobs(plan.model.tokenizer, plan.logprob_ids()) for _ in range(n)]
        self._outs = [plan.out_stream() for _ in range(n)]
        self._ids_on = req.return_token_ids
        self._warned = False  # the warnings ride on the stream's first chunk, whichever it is
        self._running = RunningUsage([len(plan.prompt_of(c)) for c in range(n)],
                                     req.stream_options)
        self._scored_echo = req.echo and req.logprobs is not None

    def _chunk(self, c: int, text: str, *, logprobs: CompletionLogprobs | None = None,
               ids: list[int] | None = None, first: bool = False,
               finish: str | None = None, stop_reason: int | str | None = None,
               moves: Sequence[str] = (),
               spans: list[WeightVersionSpan] | None = None) -> CompletionChunk:
        plan, ids_on = self._plan, self._ids_on
        warnings, self._warned = (None if self._warned else plan.warnings), True
        return CompletionChunk(
            **self._env, warnings=migration_warnings(warnings, moves),
            usage=self._running.of(c), choices=[CompletionChoice(
                text=text, index=c, logprobs=logprobs, finish_reason=finish,
                token_ids=ids if ids_on else None,
                prompt_token_ids=plan.prompt_of(c) if ids_on and first
                and not plan.space.translate else None,
                stop_reason=stop_reason if ids_on else None, weight_versions=spans)])

    def start(self) -> list[CompletionChunk]:
        req, plan = self._req, self._plan
        if not ((req.echo and not self._scored_echo) or self._ids_on):
            return []
        return [self._chunk(c, plan.echo_text(c) if not self._scored_echo else "", ids=[],
                            first=True) for c in range(len(self._outs))]

    def update(self, u: ChoiceUpdate) -> list[CompletionChunk]:
        c, plan = u.index, self._plan
        self._running.add(u)
        out = []
        if u.prompt_logprobs is not None and self._scored_echo:
            events = plan.prompt_events(c, u.prompt_logprobs)
            out.append(self._chunk(c, plan.echo_text(c), logprobs=self._lps[c].take(events),
                                   ids=[]))
        if u.delta:
            out.append(self._chunk(
                c, u.delta.text, ids=self._outs[c].push(u.delta.ids),
                logprobs=self._lps[c].take(u.delta.events)
                if self._req.logprobs is not None else None,
                spans=None if u.finish_reason is not None else wire_spans(u.weight_versions)))
        if u.finish_reason is not None:
            # ids a translation held back (their text has gone out already)
            out.append(self._chunk(c, "", ids=self._outs[c].finish(), finish=u.finish_reason,
                                   stop_reason=plan.stop_reason(u.stop_reason),
                                   moves=u.migrations, spans=wire_spans(u.weight_versions)))
        return out

    async def close(self, usage: Usage) -> list[CompletionChunk]:
        opts = self._req.stream_options
        if opts is not None and opts.include_usage:
            return [CompletionChunk(**self._env, choices=[], usage=usage)]
        return []

    def fail(self, exc: TokenwireError) -> None:
        return None

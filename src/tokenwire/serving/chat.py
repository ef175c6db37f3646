"""POST /v1/chat/completions: messages -> prompt ids (in token space) -> choices -> response.

No HTTP here: the router hands a parsed request in and renders what comes back.
`create` returns a whole `ChatCompletion`; `stream` validates, admits every choice, and only
then returns the iterator of chunks, so every error it can raise happens before the first byte.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from ..config import Settings
from ..engines.base import Grammar, Thought, TokenEvent
from ..engines.grammars.xgrammar import structural_tag
from ..errors import InvalidRequestError, TokenwireError, UnsupportedParameterError
from ..metrics import Metrics
from ..protocol._base import Frame
from ..protocol.chat import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChoiceLogprobs,
    ResponseMessage,
)
from ..protocol.common import ResponseWarning, Usage
from ..protocol.render import RenderResponse
from ..protocol.tools import DeltaFunction, DeltaToolCall, ResponseFunction, ResponseToolCall
from ..storage import StoredCompletion
from ..tokenizers.base import Tokenizer
from ..tokenizers.conversions import Reason, conversion_reason
from ..tokenizers.registry import TokenizerRegistry
from .checks import check_generation_request
from .documents import DocumentService
from .generation import (
    ChoiceResult,
    Choices,
    ChoiceUpdate,
    RunningUsage,
    StreamedResponse,
    Totals,
    migration_warnings,
    run_choices,
    wire_spans,
)
from .guard import Guard
from .logprobs import chat_logprobs, chat_logprobs_json, prompt_logprobs
from .messages import (
    Conversation,
    carries_ids,
    drift_warnings,
    message_texts,
    render_messages,
    sampled_openings,
    template_variables,
)
from .models import ModelRegistry, ServedModel
from .output import Delta
from .prefix import PromptPrefix, continued
from .reasoning import ReasoningFormat
from .sampling_params import (
    VllmParams,
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
from .stored_completions import StoredCompletions
from .structured import Constraints, resolve_constraints
from .template import ChatTemplate
from .tokens import IdSpan, TokenSpace, check_id_range
from .toolcalls import HERMES, CallParser, CallPiece, ParsedDelta

__all__ = ["ChatPlan", "ChatService", "PromptPrefix"]


@dataclass(kw_only=True)
class ChatPlan(Plan):
    req: ChatCompletionRequest
    conv: Conversation
    constraints: Constraints
    budget: int
    prompt: list[int]
    """The rendered conversation, after `truncate_prompt_tokens`."""
    extras: VllmParams
    echo: str = ""
    """`echo`: the text the response's content starts with."""
    reasoning: tuple[ReasoningFormat, bool] | None = None
    """Where the model reasons: its format, and whether the prompt leaves it inside its
    reasoning (serving/reasoning.py)."""

    def usage(self, t: Totals) -> Usage:
        """The response's usage (`reasoning_tokens` where the model's reasoning is split)."""
        return Usage.of(len(self.prompt), t.sampled, t.cached.get(0),
                        t.reasoning if self.reasoning is not None else None)

    def envelope(self) -> dict[str, Any]:
        env = super().envelope()
        if self.shows_ids:
            env["template_version"] = self.model.template_version
        return env

    def parser(self) -> CallParser | None:
        if not self.constraints.parse_tools:
            return None
        return (self.model.tools or HERMES).parser()

    def finish_reason(self, reason: str | None, parser: CallParser | None) -> Any:
        """A choice that made calls ends with "tool_calls" (a named tool_choice: "stop", as
        OpenAI's); "length" stays "length"."""
        if reason == "stop" and parser is not None and parser.calls \
                and not self.constraints.named:
            return "tool_calls"
        return reason


def _check_shape(req: ChatCompletionRequest, settings: Settings) -> None:
    check_generation_request(
        req, settings,
        prompt_scored="prompt_logprobs" if req.prompt_logprobs is not None else None)
    if req.return_tokens_as_token_ids and req.tokenizer_fallback == "translate":
        raise InvalidRequestError(
            "return_tokens_as_token_ids spells each logprob token by the model's id, which the "
            "client's version does not have under tokenizer_fallback 'translate' (entries carry "
            "the client's `id` where one exists)", param="return_tokens_as_token_ids",
            code="invalid_value")
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequestError("top_logprobs requires logprobs to be true",
                                  param="top_logprobs", code="invalid_value")
    if req.prompt_logprobs is not None and req.stream:
        raise InvalidRequestError("prompt_logprobs are returned by non-streaming requests",
                                  param="prompt_logprobs", code="invalid_value")
    if req.continue_final_message and req.add_generation_prompt:
        raise InvalidRequestError(
            "continue_final_message needs add_generation_prompt false (the prompt cannot both "
            "continue the last message and open a new one)", param="continue_final_message",
            code="invalid_value")


def _check_hidden_reasoning(req: ChatCompletionRequest) -> None:
    """`include_reasoning: false` hides the reasoning; ids and logprobs would show it (vLLM
    drops them silently; here the client hears it)."""
    if req.include_reasoning:
        return
    for param, on in (("response_format_tokens", bool(req.response_format_tokens)),
                      ("return_token_ids", req.return_token_ids), ("logprobs", req.logprobs)):
        if on:
            raise InvalidRequestError(
                f"include_reasoning false hides the model's reasoning, which {param} would "
                "show (every sampled id, the reasoning's included)", param="include_reasoning",
                code="invalid_value")


def _thinking_switch(req: ChatCompletionRequest, model: ServedModel,
                     template: ChatTemplate) -> dict[str, Any] | None:
    """The template variables with `reasoning_effort` as vLLM passes it: to a template that
    reads it (gpt-oss's "Reasoning: high"), and as `enable_thinking` (false for "none", else
    true) to one with that switch, unless `chat_template_kwargs` set it. "none" also means
    `reasoning_effort: "none"`, Messages' `thinking: disabled`, Responses' `reasoning.effort:
    "none"`. A level the template cannot take (no `reasoning_effort` variable: Qwen3's has only
    the switch) is refused by name, never dropped."""
    kwargs, effort = dict(req.chat_template_kwargs or {}), req.reasoning_effort
    if effort is None:
        return req.chat_template_kwargs
    levels = re.search(r"\breasoning_effort\b", template.source) is not None
    switch = "enable_thinking" in template.source
    if levels:
        kwargs.setdefault("reasoning_effort", effort)
    elif effort != "none":
        raise UnsupportedParameterError(
            f"model {model.id!r}'s chat template takes no reasoning level (it reads no "
            "`reasoning_effort`)" + (": only 'none' turns its thinking off" if switch else ""),
            param="reasoning_effort")
    elif model.reasoning is None:
        return req.chat_template_kwargs  # nothing to turn off
    elif not switch:
        raise UnsupportedParameterError(
            f"model {model.id!r} reasons, and its chat template has no switch to turn that off "
            "(`enable_thinking`)", param="reasoning_effort")
    if switch:
        if effort == "none" and kwargs.get("enable_thinking", False) is not False:
            raise InvalidRequestError(
                "reasoning_effort 'none' turns thinking off, which chat_template_kwargs."
                "enable_thinking turns on", param="reasoning_effort", code="invalid_value")
        kwargs.setdefault("enable_thinking", effort != "none")
    return kwargs


def _drop_reasoning(req: ChatCompletionRequest, fmt: ReasoningFormat,
                    space: TokenSpace) -> ChatCompletionRequest:
    """`keep_reasoning: false`: each assistant turn without its reasoning (ids: cut out as
    ids, `ReasoningFormat.strip`; text: its `reasoning` not given to the template)."""
    if space.translate:
        raise UnsupportedParameterError(
            "keep_reasoning false cuts the reasoning out of the sent ids by the model's own "
            "marker ids, which ids of another tokenizer version do not have",
            param="keep_reasoning")
    tok = space.model.tokenizer
    messages = [m.model_copy(update={
        "reasoning": None,
        "token_ids": fmt.strip(tok, m.token_ids) if m.token_ids is not None else None})
        if m.role == "assistant" else m for m in req.messages]
    return req.model_copy(update={"messages": messages})


def _rewrapped(req: ChatCompletionRequest, conv: Conversation, fmt: ReasoningFormat,
               tok: Tokenizer, openings: dict[int, list[int]],
               kept: int) -> list[ResponseWarning]:
    """Assistant turns sent as sampled ids before which the template wrote a reasoning block of
    its own (Qwen 3.5's, for a turn after the last user message: `<think>\\n\\n</think>\\n\\n`):
    the ids are kept as sent, the model did not see that block, and the client is told which
    turn (the render endpoint's spans show where); not the first `kept` messages, which a
    continued response's own ids replace."""
    out = []
    for i, start, _ in conv.spans:
        m = req.messages[i]
        if m.role != "assistant" or not m.token_ids or i < kept:
            continue
        before = conv.ids[max(0, start - len(openings.get(i, ())) - 4):
                          start - len(openings.get(i, ()))]
        if fmt.end_id in before if fmt.end_id is not None else fmt.end in tok.decode(before):
            out.append(ResponseWarning(
                code="reasoning_block_added", param=f"messages[{i}]", message_index=i,
                message=f"the chat template wrote a reasoning block of its own before "
                        f"messages[{i}]'s sampled ids, which the model did not see there: "
                        "the prompt is not the last prompt and the sampled ids (send the turn "
                        "with keep_reasoning false, or as text)"))
    return out


def _check_translatable(req: ChatCompletionRequest, constraints: Constraints) -> None:
    """What names the model's own ids (or needs them untouched) cannot be combined with
    `tokenizer_fallback: "translate"`, where the client's ids are another tokenizer's."""
    if constraints.parse_tools:
        raise UnsupportedParameterError(
            "tool calls cannot be combined with tokenizer_fallback 'translate' (the ids "
            "of each call piece would be re-encoded)", param="tokenizer_fallback")
    for param, value in (("stop_token_ids", req.stop_token_ids),
                         ("logit_bias", req.logit_bias)):
        if value:
            raise UnsupportedParameterError(
                f"{param} names the model's ids; it cannot be combined with "
                "tokenizer_fallback 'translate'", param=param)


def _after_reasoning(req: ChatCompletionRequest, constraints: Constraints, model: ServedModel,
                     prompt: list[int], inside: bool) -> Constraints:
    """A grammar holds after the model's reasoning (on an engine that can say so), unless the
    prompt closed the reasoning already (Qwen3's `enable_thinking: false`); a reasoning budget
    (`thinking_token_budget`, vLLM's) is such a grammar too, which only bounds the thought."""
    fmt, grammar, budget = model.reasoning, constraints.grammar, req.thinking_token_budget
    if budget is not None and (fmt is None or not model.engine.info.grammar_after_reasoning):
        raise UnsupportedParameterError(
            f"model {model.id!r} does not reason" if fmt is None else
            f"model {model.id!r} is served by an engine that cannot bound its reasoning (the "
            "embedded engine can; vLLM with its own --reasoning-parser reads the field itself)",
            param="thinking_token_budget")
    if fmt is None or (grammar is None and budget is None) \
            or not model.engine.info.grammar_after_reasoning \
            or not (inside or not fmt.closed(model.tokenizer, prompt)):
        return constraints
    thought = Thought(fmt.start, fmt.end, inside, budget)
    return replace(constraints, grammar=replace(grammar or Grammar(param="thinking_token_budget"),
                                                reasoning=thought))


def _unconstrained(model: str) -> ResponseWarning:
    return ResponseWarning(
        code="tool_calls_unconstrained", param="tool_choice",
        message=f"model {model!r} cannot constrain tool calls under tool_choice 'auto' (its "
                "engine has no lazy grammar, or its call format has none yet): calls the "
                "model writes are parsed, not enforced")


def _echo(req: ChatCompletionRequest, space: TokenSpace) -> str:
    """`echo`: the last message's text, which the response's content starts with (none when
    the response shows ids only)."""
    if not req.echo or req.messages[-1].role != "assistant" \
            or req.response_format_tokens == "only":
        return ""
    with conversion_reason("echo"):
        return message_texts(req.messages[-1:], space)[0]


def _tool_deltas(pieces: Sequence[CallPiece]) -> list[DeltaToolCall] | None:
    """OpenAI's stream pieces: a call's first carries its id and name (and `arguments: ""`),
    the next ones pieces of its arguments; pieces of one call in one update are merged."""
    out: list[DeltaToolCall] = []
    for p in pieces:
        if out and out[-1].index == p.index and p.id is None:
            fn = out[-1].function
            fn.arguments = (fn.arguments or "") + p.arguments
            continue
        out.append(DeltaToolCall(
            index=p.index, id=p.id, type="function" if p.id is not None else None,
            function=DeltaFunction(name=p.name, arguments=p.arguments)))
    return out or None


def _text_reason(req: ChatCompletionRequest, constraints: Constraints) -> Reason | None:
    """Why the output is made text: for `content`, for the tool-call parser; None when the
    response shows ids only (the content policy's output check asks for it by itself)."""
    if req.response_format_tokens != "only":
        return "output"
    return "tools" if constraints.parse_tools else None


class ChatService(GenerationService):
    def __init__(self, models: ModelRegistry, tokenizers: TokenizerRegistry, settings: Settings,
                 guard: Guard, metrics: Metrics, *, stored: StoredCompletions | None = None,
                 documents: DocumentService | None = None):
        super().__init__(models, tokenizers, settings, guard, metrics)
        self.stored = stored
        self.documents = documents
        """Without a store (both None), `store` and documents are refused."""

    def plan(self, req: ChatCompletionRequest, caller: Caller = ANONYMOUS, *,
             prefix: PromptPrefix | None = None) -> ChatPlan:
        """Everything checked and the prompt built; nothing has reached the engine yet.
        `prefix` (the Responses API's `previous_response_id`, never on the wire): the leading
        messages stand for a stored turn, whose exact ids the prompt starts with."""
        _check_shape(req, self._settings)
        model = self._models.get(req.model)
        check_engine_features(model, logprobs=req.logprobs,
                              prompt_logprobs=req.prompt_logprobs is not None)
        check_sampling_mask(model, temperature=req.temperature, top_k=req.top_k)
        constraints = resolve_constraints(req, model.engine.info, model.id, model.tools)
        sent_ids = carries_ids(req.messages)
        space = self._space(model, req.tokenizer_version, req.tokenizer_fallback, sent_ids)
        if space.translate:
            _check_translatable(req, constraints)
        check_id_range([IdSpan("stop_token_ids", req.stop_token_ids or [])],
                       space.client.tokenizer)
        warnings = self._guard.check_conversation(req.messages, req.tools or [], space,
                                                  caller.api_key)
        template = model.chat_template()
        if not req.keep_reasoning and model.reasoning is not None:
            req = _drop_reasoning(req, model.reasoning, space)
        variables = template_variables(_thinking_switch(req, model, template), template)
        how: dict[str, Any] = dict(
            tools=req.tools or [], fmt=model.tools or HERMES, variables=variables,
            openings=sampled_openings(req.messages, template, variables)
            if req.keep_reasoning and not space.translate else {},
            control_ids=self._settings.allow_special_token_ids
            or self._settings.raw_prompts_allowed(caller.api_key))
        conv = render_messages(req.messages, space, template,
                               add_generation_prompt=req.add_generation_prompt,
                               continue_final=req.continue_final_message, **how)
        if model.reasoning is not None:
            wrapped = _rewrapped(req, conv, model.reasoning, model.tokenizer, how["openings"],
                                 prefix.messages if prefix is not None else 0)
            warnings = [*(warnings or []), *wrapped] if wrapped else warnings
        if prefix is not None:
            head = render_messages(req.messages[:prefix.messages], space, template,
                                   add_generation_prompt=False, **how)
            conv = continued(prefix, conv, head)
        requested = req.max_completion_tokens or req.max_tokens
        prompt = truncate_prompt(conv.ids, req.truncate_prompt_tokens, req.truncation_side,
                                 max_model_len=model.max_model_len,
                                 reserve=requested or self._settings.default_max_tokens)
        check = req.check_drift if req.check_drift is not None else self._settings.check_drift
        if check:
            drift = drift_warnings(req.messages, space, template, model.tools or HERMES)
            warnings = [*(warnings or []), *drift]
        if constraints.unconstrained:
            warnings = [*(warnings or []), _unconstrained(model.id)]
        budget = completion_budget(
            prompt_len=len(prompt), max_model_len=model.max_model_len,
            requested=requested, prompt_param="messages",
            limit_param="max_completion_tokens" if req.max_completion_tokens else "max_tokens",
            cap=self._settings.max_tokens_limit,
            default=self._settings.default_max_tokens,
        )
        extras = vllm_params(req, req.logit_bias, vocab_size=model.tokenizer.vocab_size,
                             budget=budget, cache_salt=req.cache_salt,
                             cache_key=req.prompt_cache_key,
                             weight_bound=weight_bound(req, self._settings),
                             adapter=model.adapter)
        reasoning = None
        if model.reasoning is not None:
            _check_hidden_reasoning(req)
            reasoning = (model.reasoning, model.reasoning.starts_inside(model.tokenizer, prompt))
        constraints = _after_reasoning(req, constraints, model, prompt,
                                       reasoning is not None and reasoning[1])
        return ChatPlan(req=req, model=model, space=space, conv=conv, constraints=constraints,
                     budget=budget, prompt=prompt, extras=extras, echo=_echo(req, space),
                     reasoning=reasoning,
                     sent_ids=sent_ids, skip_special=bool(req.skip_special_tokens),
                     shows_ids=bool(req.response_format_tokens) or req.return_token_ids,
                     id=f"chatcmpl-{req.request_id or uuid.uuid4().hex}",
                     warnings=warnings or None,
                     logprobs_mode=model.engine.info.logprobs_mode if req.logprobs else None)

    async def updates(self, plan: ChatPlan) -> Choices:
        """Admit a plan's choices; their updates (what the Responses API renders instead)."""
        return await self._start(plan)

    async def _start(self, plan: ChatPlan, *, whole: bool = False) -> Choices:
        req = plan.req
        params = choice_params(
            n=req.n, max_tokens=plan.budget, temperature=req.temperature, top_p=req.top_p,
            seed=req.seed, logprobs=(req.top_logprobs or 0) if req.logprobs else None,
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
            prompt_logprobs=req.prompt_logprobs, grammar=plan.constraints.grammar,
            extras=plan.extras,
        )
        return await run_choices(plan.model.engine, [(plan.prompt, p) for p in params],
                                 plan.model.tokenizer, req.stop or (),
                                 token_aligned=plan.shows_ids,
                                 text=_text_reason(req, plan.constraints),
                                 output_check=self._guard.output_check(),
                                 timer=self._timer(plan),
                                 include_stop=req.include_stop_str_in_output,
                                 # tool calls are parsed from the text: their tags stay in it
                                 skip_special=bool(req.skip_special_tokens)
                                 and not plan.constraints.parse_tools,
                                 min_tokens=plan.extras.min_tokens, whole=whole,
                                 reasoning=plan.reasoning,
                                 coalesce=self._coalesce(req.stream_options))

    # -- responses -----------------------------------------------------------------------------

    async def render(self, req: ChatCompletionRequest,
                     caller: Caller = ANONYMOUS) -> RenderResponse:
        """The prompt a request would run with, where each message went, and the loss mask."""
        plan = await self._planned(req, caller)
        sp: dict[str, Any] = {
            "n": req.n, "max_tokens": plan.budget, "seed": req.seed,
            "presence_penalty": req.presence_penalty,
            "frequency_penalty": req.frequency_penalty,
        }
        if req.temperature is not None:
            sp["temperature"] = req.temperature
        if req.top_p is not None:
            sp["top_p"] = req.top_p
        if req.stop:
            sp["stop"] = req.stop
        if req.logprobs:
            sp["logprobs"] = req.top_logprobs or 0
        if plan.prompt != plan.conv.ids:
            raise UnsupportedParameterError(
                "render shows where every message went; a truncated prompt loses that",
                param="truncate_prompt_tokens")
        x = plan.extras
        for key, value, neutral in (
                ("top_k", x.top_k, 0), ("min_p", x.min_p, 0.0),
                ("repetition_penalty", x.repetition_penalty, 1.0),
                ("min_tokens", x.min_tokens, 0), ("ignore_eos", x.ignore_eos, False),
                ("stop_token_ids", sorted(x.stop_token_ids), []),
                ("logit_bias", {str(t): b for t, b in x.logit_bias}, {}),
                ("include_stop_str_in_output", req.include_stop_str_in_output, False)):
            if value != neutral:
                sp[key] = value
        if req.thinking_token_budget is not None:
            sp["thinking_token_budget"] = req.thinking_token_budget
        grammar = plan.constraints.grammar
        if grammar is not None and grammar.reasoning is not None and not (
                grammar.json_schema or grammar.gbnf or grammar.tags):
            grammar = None  # only the budget's: vLLM's field says it
        if grammar is not None and not grammar.lazy:  # as vLLM reads it
            sp["structured_outputs"] = {"json": json.loads(grammar.json_schema)} \
                if grammar.json_schema is not None \
                else {"structural_tag": structural_tag(grammar)}
        return RenderResponse(
            request_id=plan.id, token_ids=plan.prompt, model=plan.model.id,
            sampling_params=sp, stream=req.stream,
            tokenizer_version=plan.space.model.version,  # the prompt is in the model's ids
            template_version=plan.model.template_version,
            spans=plan.conv.message_spans(req.messages),
            sampled_mask=plan.conv.sampled, warnings=plan.warnings)

    # -- what the server keeps: documents in, completions out -----------------------------------

    async def _planned(self, req: ChatCompletionRequest, caller: Caller) -> ChatPlan:
        """The plan of `req` once its `input_document` blocks are spliced in from storage."""
        req, notes = await self._splice(req, caller)
        plan = await self._prepare(self.plan, req, caller)
        if notes:
            plan.warnings = [*notes, *(plan.warnings or [])]
        return plan

    async def _splice(self, req: ChatCompletionRequest, caller: Caller,
                      ) -> tuple[ChatCompletionRequest, list[ResponseWarning]]:
        if req.store and self.stored is None:
            raise UnsupportedParameterError("this server keeps no records (no storage)",
                                            param="store")
        if req.store and req.request_id is not None and "\x00" in req.request_id:
            raise InvalidRequestError("a stored completion's id cannot hold NUL characters",
                                      param="request_id")
        if req.store and req.request_id is not None and self.stored is not None:
            # before generating (the insert is still the arbiter between gateways)
            await self.stored.check_free(f"chatcmpl-{req.request_id}", caller)
        if self.documents is None:
            return req, []
        return await self.documents.splice(req, caller,
                                           self._models.get(req.model).tokenizer_entry.version)

    async def _keep(self, plan: ChatPlan, sent: ChatCompletionRequest,
                    completion: ChatCompletion, acc: Sequence[ChoiceResult],
                    caller: Caller) -> None:
        """`store: true`: the request as sent, the response as it went out, and the ids of
        both sides (the model's), durable before the client hears the response is done."""
        assert self.stored is not None
        whole = plan.prompt == plan.conv.ids  # a truncated prompt no longer has every message
        await self.stored.keep(StoredCompletion(
            id=plan.id, owner=caller.owner, model=plan.model.id, created=plan.created,
            tokenizer_version=plan.space.model.version,
            template_version=plan.model.template_version, prompt_ids=plan.prompt,
            vocab_size=plan.model.tokenizer.vocab_size,
            request=sent.model_dump(mode="json", exclude_unset=True, by_alias=True),
            response=completion.model_dump(mode="json"), metadata=sent.metadata or {},
            output_ids=[list(a.ids) for a in acc], spans=plan.conv.spans if whole else []))

    async def create(self, req: ChatCompletionRequest,
                     caller: Caller = ANONYMOUS) -> ChatCompletion:
        plan = await self._planned(req, caller)
        acc = await self._whole(lambda: self._start(plan, whole=True), plan.req.n)
        completion = self._completion(plan, acc, self._count(plan, Totals.of(acc)))
        if req.store:
            await self._keep(plan, req, completion, acc, caller)
        return completion

    def _completion(self, plan: ChatPlan, acc: Sequence[ChoiceResult],
                    usage: Usage | None) -> ChatCompletion:
        req = plan.req
        tok = plan.model.tokenizer
        as_ids = req.return_tokens_as_token_ids
        choices = []
        for i, a in enumerate(acc):
            text: str | None = a.text
            ids = plan.out_ids(a.ids)
            parser = plan.parser()
            calls = None
            if parser is not None:
                text = parser.push(Delta(a.content_ids, a.text), last=True).content
                calls = [ResponseToolCall(id=c.id, function=ResponseFunction(
                    name=c.name, arguments=c.arguments)) for c in parser.calls] or None
                if calls and not text:
                    text = None
            if plan.echo:
                text = plan.echo + (text or "")
            choices.append(ChatChoice(
                index=i,
                message=ResponseMessage(
                    content=None if req.response_format_tokens == "only" else text,
                    tool_calls=calls,
                    reasoning=a.reasoning if req.include_reasoning
                    and req.response_format_tokens != "only" else None,
                    token_ids=ids if req.response_format_tokens else None,
                    reasoning_token_ids=plan.out_ids(a.reasoning_ids)
                    if req.response_format_tokens and a.reasoning_ids else None,
                ),
                logprobs=ChoiceLogprobs(content=chat_logprobs_json(
                    tok, a.events, as_ids=as_ids, ids=plan.logprob_ids()))
                if req.logprobs else None,
                finish_reason=plan.finish_reason(a.finish_reason, parser),
                token_ids=ids if req.return_token_ids else None,
                stop_reason=plan.stop_reason(a.stop_reason) if plan.shows_ids else None,
                stop_logprob=_stop_logprob(req.logprobs and plan.shows_ids, a.stop_event),
                weight_versions=wire_spans(a.weight_versions),
            ))
        scored = acc[0].prompt_logprobs if req.prompt_logprobs is not None else None
        return ChatCompletion(
            **plan.envelope(),
            warnings=migration_warnings(plan.warnings, *(a.migrations for a in acc)),
            choices=choices,
            usage=usage,
            prompt_token_ids=plan.prompt if req.return_token_ids and not plan.space.translate
            else None,
            prompt_logprobs=prompt_logprobs(tok, plan.prompt, scored, as_ids=as_ids)
            if scored is not None else None,
        )

    async def stream(self, req: ChatCompletionRequest,
                     caller: Caller = ANONYMOUS) -> StreamedResponse[ChatEvent]:
        plan = await self._planned(req, caller)
        choices = await self._start(plan)

        async def keep(whole: list[ChoiceResult], usage: Usage) -> None:
            await self._keep(plan, req, self._completion(plan, whole, usage), whole, caller)

        return self._stream(plan, _ChatChunks(plan, keep if req.store else None), choices)


ChatEvent = ChatCompletionChunk | Frame
"""A streamed chat response's event: a chunk, or a plain text chunk already written."""

_MARK = "\x00tokenwire:text\x00"
"""Where a frame's text goes (no id, model or version holds it: it is NUL-delimited)."""


class _ChatChunks:
    """The chunks of one streamed chat response (a `Family`): each choice's role chunk, a
    chunk per update that shows something (text, tool-call pieces, ids in the client's
    version, logprobs, running usage), each choice's finishing chunk, then usage. `keep`:
    stores the whole response (as the same request unstreamed would have had it) before
    any choice is told it is done."""

    def __init__(self, plan: ChatPlan,
                 keep: Callable[[list[ChoiceResult], Usage], Awaitable[None]] | None = None):
        req = plan.req
        self._plan = plan
        self._keep = keep
        self._whole = [ChoiceResult() for _ in range(req.n)] if keep is not None else []
        self._held: list[ChatCompletionChunk] = []  # with `keep`: each choice's finishing chunk
        self.env = plan.envelope()
        self._only = req.response_format_tokens == "only"
        # with ids on, every delta carries token_ids (maybe []): uniform to parse
        self._delta_ids = bool(req.response_format_tokens) or req.return_token_ids
        self._parsers = [plan.parser() for _ in range(req.n)]
        self._outs = [plan.out_stream() for _ in range(req.n)]
        self._running = RunningUsage([len(plan.prompt)] * req.n, req.stream_options)
        # a chunk of text alone (no ids, logprobs, calls, reasoning or running usage shown):
        # its bytes around the text, written once per choice by the model (`_plain`)
        self._plain = not (self._only or self._delta_ids or req.logprobs
                           or self._running.of(0) is not None)
        self._frames: dict[int, tuple[bytes, bytes]] = {}

    def update(self, u: ChoiceUpdate) -> list[ChatEvent]:
        if self._keep is not None:
            self._whole[u.index].add(u)
        shown = self.delta(u)
        out: list[ChatEvent] = [shown] if shown is not None else []
        if u.finish_reason is not None:
            (out if self._keep is None else self._held).append(self.finish(u))
        return out

    async def close(self, usage: Usage) -> list[ChatEvent]:
        out: list[ChatEvent] = []
        if self._keep is not None:
            await self._keep(self._whole, usage)
            out += self._held
        opts = self._plan.req.stream_options
        if opts is not None and opts.include_usage:
            out.append(ChatCompletionChunk(**self.env, choices=[], usage=usage))
        return out

    def fail(self, exc: TokenwireError) -> None:
        return None

    def start(self) -> list[ChatEvent]:
        """Each choice's first chunk: the role (and `echo`'s text); the first also carries
        the prompt's ids and the request's warnings."""
        plan, req = self._plan, self._plan.req
        return [ChatCompletionChunk(
            **self.env,
            choices=[ChatChunkChoice(index=i, delta=ChatDelta(
                role="assistant", content=None if self._only else plan.echo,
                token_ids=[] if self._delta_ids else None))],
            usage=self._running.of(i),
            prompt_token_ids=plan.prompt if i == 0 and req.return_token_ids
            and not plan.space.translate else None,
            warnings=plan.warnings if i == 0 else None,
        ) for i in range(req.n)]

    def delta(self, u: ChoiceUpdate) -> ChatEvent | None:
        """The chunk of an update, None when it shows nothing (text a stop string may still
        claim, a tool call's markup)."""
        req = self._plan.req
        parser = self._parsers[u.index]
        reasoning: str | None = None
        parsed: ParsedDelta | None = None
        if u.part != "content":  # reasoning, or its markers: never the tool parser's
            ids, text, events = u.delta.ids, "", u.delta.events
            if u.part == "reasoning" and req.include_reasoning and not self._only:
                reasoning = u.delta.text
            visible = bool(reasoning or (ids and self._delta_ids) or (events and req.logprobs))
        elif parser is None:
            ids, text, events = u.delta.ids, u.delta.text, u.delta.events
            visible = bool(u.delta)
        else:
            parsed = parser.push(u.delta, last=u.finish_reason is not None)
            ids, text, events = parsed.ids, parsed.content, parsed.events
            visible = bool(text or parsed.calls or (ids and self._delta_ids)
                           or (events and req.logprobs))
        self._running.add(u)
        if not visible:
            return None
        out = self._outs[u.index].push(ids)
        if self._plain and parser is None and u.part == "content" \
                and (u.weight_versions is None or u.finish_reason is not None):
            head, tail = self._frame(u.index)
            return Frame(head + orjson.dumps(text) + tail)
        return ChatCompletionChunk(**self.env, usage=self._running.of(u.index), choices=[
            ChatChunkChoice(
                index=u.index,
                delta=ChatDelta(
                    content=None if self._only or u.part != "content"
                    or (parsed is not None and not text) else text,
                    reasoning=reasoning,
                    tool_calls=_tool_deltas(parsed.calls) if parsed is not None else None,
                    token_ids=out if self._delta_ids else None),
                logprobs=ChoiceLogprobs(content=chat_logprobs(
                    self._plan.model.tokenizer, events, as_ids=req.return_tokens_as_token_ids,
                    ids=self._plan.logprob_ids())) if req.logprobs else None,
                token_ids=out if req.return_token_ids else None,
                weight_versions=None if u.finish_reason is not None
                else wire_spans(u.weight_versions))])

    def _frame(self, index: int) -> tuple[bytes, bytes]:
        """A plain text chunk's bytes before and after its text, as the model writes them
        (tests/api/test_chat_http.py holds every frame to the model's own dump)."""
        got = self._frames.get(index)
        if got is None:
            mark = orjson.dumps(_MARK)
            whole = ChatCompletionChunk(**self.env, usage=None, choices=[ChatChunkChoice(
                index=index, delta=ChatDelta(content=_MARK))]).model_dump_json().encode()
            head, found, tail = whole.partition(mark)
            assert found and mark not in tail
            got = self._frames[index] = (head, tail)
        return got

    def finish(self, u: ChoiceUpdate) -> ChatCompletionChunk:
        """A choice's last chunk: why it ended, the ids a translation held back (their text
        has gone out already), the stop id and its logprob, its weights."""
        plan, req = self._plan, self._plan.req
        rest = self._outs[u.index].finish()
        return ChatCompletionChunk(
            **self.env, usage=self._running.of(u.index),
            warnings=migration_warnings(None, u.migrations),
            choices=[ChatChunkChoice(
                index=u.index, delta=ChatDelta(token_ids=rest if self._delta_ids else None),
                finish_reason=plan.finish_reason(u.finish_reason, self._parsers[u.index]),
                token_ids=rest if req.return_token_ids and rest else None,
                stop_reason=plan.stop_reason(u.stop_reason) if plan.shows_ids else None,
                stop_logprob=_stop_logprob(req.logprobs and plan.shows_ids, u.stop_event),
                weight_versions=wire_spans(u.weight_versions))])


def _stop_logprob(shown: bool | None, stop: TokenEvent | None) -> float | None:
    """The sampled stop id's logprob, where the choice shows ids and logprobs."""
    return stop.logprob if shown and stop is not None else None

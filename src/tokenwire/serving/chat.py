"""POST /v1/chat/completions: messages -> prompt ids (in token space) -> choices -> response.

No HTTP here: the router hands a parsed request in and renders what comes back.
`create` returns a whole `ChatCompletion`; `stream` validates, admits every choice, and only
then returns the iterator of chunks, so every error it can raise happens before the first byte.

`ChatService.plan` builds the prompt; the rest is split by concern: the request's checks
(checks.py), its reasoning switches (chat_reasoning.py), the plan (chat_plan.py), both response
kinds (chat_response.py), the render endpoint's vLLM mapping (chat_render.py), and what is read
from and kept in storage (chat_storage.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from ..config import Settings
from ..metrics import Metrics
from ..protocol.chat import ChatCompletion, ChatCompletionRequest
from ..protocol.common import ResponseWarning, Usage
from ..protocol.render import RenderResponse
from ..tokenizers.conversions import Reason, conversion_reason
from ..tokenizers.registry import TokenizerRegistry
from .chat_plan import ChatPlan
from .chat_reasoning import (
    after_reasoning,
    drop_reasoning,
    reasoning_blocks_added,
    thinking_switch,
)
from .chat_render import render_response
from .chat_response import ChatChunks, ChatEvent, chat_completion
from .chat_storage import splice_documents, stored_record
from .checks import check_chat_request, check_hidden_reasoning, check_translatable
from .documents import DocumentService
from .generation import ChoiceResult, Choices, StreamedResponse, Totals, run_choices
from .guard import Guard
from .messages import (
    carries_ids,
    drift_warnings,
    message_texts,
    render_messages,
    sampled_openings,
    template_variables,
)
from .models import ModelRegistry
from .prefix import PromptPrefix, continued
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
    check_engine_features,
    check_sampling_mask,
)
from .stored_completions import StoredCompletions
from .structured import Constraints, resolve_constraints
from .tokens import IdSpan, TokenSpace, check_id_range
from .toolcalls import HERMES

__all__ = ["ChatPlan", "ChatService", "PromptPrefix"]


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
        check_chat_request(req, self._settings)
        model = self._models.get(req.model)
        check_engine_features(model, logprobs=req.logprobs,
                              prompt_logprobs=req.prompt_logprobs is not None)
        check_sampling_mask(model, temperature=req.temperature, top_k=req.top_k)
        constraints = resolve_constraints(req, model.engine.info, model.id, model.tools)
        sent_ids = carries_ids(req.messages)
        space = self._space(model, req.tokenizer_version, req.tokenizer_fallback, sent_ids)
        if space.translate:
            check_translatable(req, constraints)
        check_id_range([IdSpan("stop_token_ids", req.stop_token_ids or [])],
                       space.client.tokenizer)
        warnings = self._guard.check_conversation(req.messages, req.tools or [], space,
                                                  caller.api_key)
        template = model.chat_template()
        if not req.keep_reasoning and model.reasoning is not None:
            req = drop_reasoning(req, model.reasoning, space)
        variables = template_variables(thinking_switch(req, model, template), template)
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
            wrapped = reasoning_blocks_added(req, conv, model.reasoning, model.tokenizer,
                                             how["openings"],
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
            check_hidden_reasoning(req)
            reasoning = (model.reasoning, model.reasoning.starts_inside(model.tokenizer, prompt))
        constraints = after_reasoning(req, constraints, model, prompt,
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
        return render_response(await self._planned(req, caller), req)

    # -- what the server keeps: documents in, completions out -----------------------------------

    async def _planned(self, req: ChatCompletionRequest, caller: Caller) -> ChatPlan:
        """The plan of `req` once its `input_document` blocks are spliced in from storage."""
        req, notes = await splice_documents(
            req, caller, stored=self.stored, documents=self.documents, models=self._models)
        plan = await self._prepare(self.plan, req, caller)
        if notes:
            plan.warnings = [*notes, *(plan.warnings or [])]
        return plan

    async def _keep(self, plan: ChatPlan, sent: ChatCompletionRequest,
                    completion: ChatCompletion, acc: Sequence[ChoiceResult],
                    caller: Caller) -> None:
        """`store: true`: the request as sent, the response as it went out, and the ids of
        both sides (the model's), durable before the client hears the response is done."""
        assert self.stored is not None
        await self.stored.keep(stored_record(plan, sent, completion, acc, caller))

    async def create(self, req: ChatCompletionRequest,
                     caller: Caller = ANONYMOUS) -> ChatCompletion:
        plan = await self._planned(req, caller)
        acc = await self._whole(lambda: self._start(plan, whole=True), plan.req.n)
        completion = chat_completion(plan, acc, self._count(plan, Totals.of(acc)))
        if req.store:
            await self._keep(plan, req, completion, acc, caller)
        return completion

    async def stream(self, req: ChatCompletionRequest,
                     caller: Caller = ANONYMOUS) -> StreamedResponse[ChatEvent]:
        plan = await self._planned(req, caller)
        choices = await self._start(plan)

        async def keep(whole: list[ChoiceResult], usage: Usage) -> None:
            await self._keep(plan, req, chat_completion(plan, whole, usage), whole, caller)

        return self._stream(plan, ChatChunks(plan, keep if req.store else None), choices)


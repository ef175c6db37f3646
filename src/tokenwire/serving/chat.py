"""POST /v1/chat/completions: messages -> prompt ids (in token space) -> choices -> response.

No HTTP here: the router hands a parsed request in and renders what comes back.
`create` returns a whole `ChatCompletion`; `stream` validates, admits every choice, and only
then returns the iterator of chunks, so every error it can raise happens before the first byte.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from ..config import Settings
from ..errors import ContentPolicyViolationError, InvalidRequestError
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
from ..protocol.common import Usage
from .checks import check_generation_request
from .generation import ChoiceUpdate, run_choices
from .logprobs import chat_logprobs
from .messages import check_messages, message_id_spans, message_texts, render_messages
from .plan import GenerationService, Plan, check_engine_features
from .sampling import choice_params, completion_budget
from .tokens import check_id_range

__all__ = ["ChatService"]


@dataclass(kw_only=True)
class _Plan(Plan):
    req: ChatCompletionRequest
    prompt: list[int]


def _check_shape(req: ChatCompletionRequest, settings: Settings) -> None:
    check_generation_request(req, settings, logprobs_requested=req.logprobs)
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequestError("top_logprobs requires logprobs to be true",
                                  param="top_logprobs", code="invalid_value")
    check_messages(req.messages)
    if len(req.messages) > settings.max_messages:
        raise InvalidRequestError(f"at most {settings.max_messages} messages per request",
                                  param="messages", code="invalid_value")


class ChatService(GenerationService):
    def plan(self, req: ChatCompletionRequest) -> _Plan:
        """Everything checked and the prompt built; nothing has reached the engine yet."""
        _check_shape(req, self._settings)
        model = self._models.get(req.model)
        check_engine_features(model, logprobs=req.logprobs, prompt_logprobs=False)
        spans = message_id_spans(req.messages)
        space = self._space(model, req.tokenizer_version, req.tokenizer_fallback, bool(spans))
        check_id_range(spans, space.client.tokenizer)
        warnings = self._guard.check_ids(spans, space.client.tokenizer)
        texts = message_texts(req.messages, space)
        self._guard.check_texts([(f"messages[{i}].content", t) for i, t in enumerate(texts)],
                                "messages")
        prompt = render_messages(req.messages, space, model.chat_template())
        return _Plan(req=req, model=model, space=space, prompt=prompt,
                     shows_ids=bool(req.response_format_tokens) or req.return_token_ids,
                     id=f"chatcmpl-{uuid.uuid4().hex}", warnings=warnings or None)

    async def _start(self, plan: _Plan) -> AsyncGenerator[ChoiceUpdate, None]:
        req = plan.req
        requested = req.max_completion_tokens or req.max_tokens
        budget = completion_budget(
            prompt_len=len(plan.prompt), max_model_len=plan.model.max_model_len,
            requested=requested, prompt_param="messages",
            limit_param="max_completion_tokens" if req.max_completion_tokens else "max_tokens",
            cap=self._settings.max_tokens_limit,
        )
        params = choice_params(
            n=req.n, max_tokens=budget, temperature=req.temperature, top_p=req.top_p,
            seed=req.seed, logprobs=(req.top_logprobs or 0) if req.logprobs else None,
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        )
        return await run_choices(plan.model.engine, [(plan.prompt, p) for p in params],
                                 plan.model.tokenizer, req.stop or (),
                                 token_aligned=plan.shows_ids,
                                 output_check=self._guard.output_check())

    # -- responses -----------------------------------------------------------------------------

    async def create(self, req: ChatCompletionRequest) -> ChatCompletion:
        plan = self.plan(req)
        acc = await self._whole(lambda: self._start(plan), req.n)
        tok = plan.model.tokenizer
        choices = []
        for i, a in enumerate(acc):
            text = a.text
            ids = plan.out_ids(a.ids, text)
            choices.append(ChatChoice(
                index=i,
                message=ResponseMessage(
                    content=None if req.response_format_tokens == "only" else text,
                    token_ids=ids if req.response_format_tokens else None,
                ),
                logprobs=ChoiceLogprobs(content=chat_logprobs(tok, a.events))
                if req.logprobs else None,
                finish_reason=a.finish_reason,
                token_ids=ids if req.return_token_ids else None,
                stop_reason=a.stop_reason if plan.shows_ids else None,
            ))
        completion = sum(a.n_sampled for a in acc)
        return ChatCompletion(
            **plan.envelope(),
            warnings=plan.warnings,
            choices=choices,
            usage=Usage(prompt_tokens=len(plan.prompt), completion_tokens=completion,
                        total_tokens=len(plan.prompt) + completion),
            prompt_token_ids=plan.prompt if req.return_token_ids and not plan.space.translate
            else None,
        )

    async def stream(self, req: ChatCompletionRequest) -> AsyncIterator[ChatCompletionChunk]:
        plan = self.plan(req)
        updates = await self._start(plan)
        return self._chunks(plan, updates)

    async def _chunks(self, plan: _Plan, updates: AsyncIterator[ChoiceUpdate],
                      ) -> AsyncIterator[ChatCompletionChunk]:
        req = plan.req
        env = plan.envelope()
        only = req.response_format_tokens == "only"
        # with token output on, every delta carries token_ids (maybe []): uniform to parse
        no_ids: list[int] | None = [] if req.response_format_tokens else None
        tok = plan.model.tokenizer
        first = True
        for i in range(req.n):
            yield ChatCompletionChunk(
                **env,
                choices=[ChatChunkChoice(index=i, delta=ChatDelta(
                    role="assistant", content=None if only else "", token_ids=no_ids))],
                prompt_token_ids=plan.prompt if first and req.return_token_ids
                and not plan.space.translate else None,
                warnings=plan.warnings if first else None,
            )
            first = False
        completion = 0
        try:
            async for u in updates:
                if u.delta:
                    ids = plan.out_ids(u.delta.ids, u.delta.text)
                    yield ChatCompletionChunk(**env, choices=[ChatChunkChoice(
                        index=u.index,
                        delta=ChatDelta(
                            content=None if only else u.delta.text,
                            token_ids=ids if req.response_format_tokens else None,
                        ),
                        logprobs=ChoiceLogprobs(content=chat_logprobs(tok, u.delta.events))
                        if req.logprobs else None,
                        token_ids=ids if req.return_token_ids else None,
                    )])
                if u.finish_reason is not None:
                    completion += u.n_sampled
                    yield ChatCompletionChunk(**env, choices=[ChatChunkChoice(
                        index=u.index, delta=ChatDelta(token_ids=no_ids),
                        finish_reason=u.finish_reason,
                        stop_reason=u.stop_reason if plan.shows_ids else None,
                    )])
                    if u.finish_reason == "content_filter":
                        raise ContentPolicyViolationError(
                            "the output was stopped by the server's content policy")
        finally:
            aclose = getattr(updates, "aclose", None)
            if aclose is not None:
                await aclose()
        if req.stream_options is not None and req.stream_options.include_usage:
            yield ChatCompletionChunk(
                **env,
                choices=[],
                usage=Usage(prompt_tokens=len(plan.prompt), completion_tokens=completion,
                            total_tokens=len(plan.prompt) + completion),
            )

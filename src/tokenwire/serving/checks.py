"""Request checks of shape (ids are in tokens.py): those every generating endpoint shares, and
chat's own."""

from __future__ import annotations

from typing import Any

from ..config import Settings
from ..errors import InvalidRequestError, UnsupportedParameterError
from ..protocol.chat import ChatCompletionRequest
from .structured import Constraints

__all__ = ["check_chat_request", "check_generation_request", "check_hidden_reasoning",
           "check_translatable"]


def check_generation_request(req: Any, settings: Settings, *, prompt_scored: str | None,
                             ) -> None:
    """Fields tokenwire does not implement, `n`, `stream_options`, and combinations.
    `prompt_scored`: the field that asks for the prompt's logprobs, if the request does."""
    for name, neutral in type(req).unsupported.items():
        if getattr(req, name) not in neutral:
            raise UnsupportedParameterError(f"{name!r} is not supported by this server",
                                            param=name)
    if req.n > settings.max_n:
        raise InvalidRequestError(f"n must be at most {settings.max_n}", param="n",
                                  code="invalid_value")
    if req.stream_options is not None and not req.stream:
        raise InvalidRequestError("stream_options is only allowed when stream is true",
                                  param="stream_options", code="invalid_value")
    if req.tokenizer_fallback == "translate" and prompt_scored is not None:
        # the prompt the model scores is in its own ids, which the client does not hold
        raise InvalidRequestError(
            "prompt logprobs score the model's own prompt ids and cannot be combined with "
            "tokenizer_fallback 'translate'", param=prompt_scored, code="invalid_value")


def check_chat_request(req: ChatCompletionRequest, settings: Settings) -> None:
    """A chat request's shape: `check_generation_request`, and combinations of chat's own
    fields."""
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


def check_hidden_reasoning(req: ChatCompletionRequest) -> None:
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


def check_translatable(req: ChatCompletionRequest, constraints: Constraints) -> None:
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

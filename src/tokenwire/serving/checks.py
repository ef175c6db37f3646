"""Request checks that every generating endpoint shares (shape only; ids are in tokens.py)."""

from __future__ import annotations

from typing import Any

from ..config import Settings
from ..errors import InvalidRequestError, UnsupportedParameterError

__all__ = ["check_generation_request"]


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

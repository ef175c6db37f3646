"""Request checks that every generating endpoint shares (shape only; ids are in tokens.py)."""

from __future__ import annotations

from typing import Any

from ..config import Settings
from ..errors import InvalidRequestError, UnsupportedParameterError

__all__ = ["check_generation_request"]


def check_generation_request(req: Any, settings: Settings, *, logprobs_requested: bool) -> None:
    """Fields tokenwire does not implement, `n`, `stream_options`, and combinations."""
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
    if req.tokenizer_fallback == "translate" and logprobs_requested:
        raise InvalidRequestError(
            "logprobs carry the model's own ids and cannot be combined with "
            "tokenizer_fallback 'translate'", param="logprobs", code="invalid_value")

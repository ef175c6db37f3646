"""An upstream's error body (a 4xx, or an in-band error in a stream), in our exception tree.

A protocol module whose server spells some errors its own way maps those in its
`protocol_error` and hands the rest to `upstream_error`.
"""

from __future__ import annotations

from typing import Any

from ...errors import (
    KNOWN_CODES,
    InvalidRequestError,
    RateLimitError,
    ServiceUnavailableError,
    TokenwireError,
    error_from_body,
)

__all__ = ["upstream_error"]


def upstream_error(status: int, body: Any, where: str) -> TokenwireError:
    """An upstream's error body in our tree. A tokenwire upstream's code names our own class;
    otherwise the status does (for an in-band error, the numeric `code` vLLM puts in the body):
    5xx -> 503 engine_unavailable, 429 -> 429, any other -> 400 `upstream_rejected`, with the
    upstream's message and param."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        err = {"message": str(err if err is not None else body)}
    code, param = err.get("code"), err.get("param")
    message = f"upstream {where}: {err.get('message', '')}"
    if status == 200:  # in-band
        status = code if isinstance(code, int) and not isinstance(code, bool) else 500
    if code == "special_token_not_allowed":  # a tokenwire upstream refusing our raw prompts
        return ServiceUnavailableError(
            f"upstream {where} refuses this gateway's rendered prompts: allow raw prompts for "
            "it there (TOKENWIRE_RAW_PROMPT_KEYS, or TOKENWIRE_RAW_PROMPTS=allow)")
    if isinstance(code, str) and code in KNOWN_CODES:
        exc = error_from_body(status, body)
        exc.message = message
        return exc
    if status >= 500:
        return ServiceUnavailableError(message)
    if status == 429:
        return RateLimitError(message)
    return InvalidRequestError(message, param=param if isinstance(param, str) else None,
                               code="upstream_rejected")

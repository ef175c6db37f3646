"""Wire models shared by several endpoints: usage, logprob entries, model cards, errors."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictInt

from ._base import RequestModel, ResponseModel

__all__ = [
    "ErrorInfo",
    "ErrorResponse",
    "LogprobEntry",
    "ModelCard",
    "ModelList",
    "ResponseWarning",
    "StreamOptions",
    "TokenId",
    "TokenLogprob",
    "Usage",
]

#: A token id as a client may send it: a JSON integer, not negative. The upper bound depends on
#: the tokenizer version and is checked by serving code.
TokenId = Annotated[StrictInt, Field(ge=0)]


class StreamOptions(RequestModel):
    include_usage: bool = False
    """Send a last chunk with `choices: []` and the request's `usage`."""


class ResponseWarning(ResponseModel):
    """Something the server accepted but wants the client to know (e.g. non-canonical ids)."""

    code: str
    param: str | None
    message: str


class Usage(ResponseModel):
    prompt_tokens: int
    completion_tokens: int
    """Every token the model sampled, the end-of-generation token included."""
    total_tokens: int


class LogprobEntry(ResponseModel):
    """One candidate token at a position: OpenAI's fields plus the integer `id`."""

    token: str
    """The token's text; `bytes:\\xNN...` when its bytes are not valid UTF-8 on their own."""
    bytes: list[int] | None
    logprob: float
    id: int
    """The vocabulary id: two ids can spell the same string, so `token` alone is ambiguous."""


class TokenLogprob(LogprobEntry):
    top_logprobs: list[LogprobEntry]


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tokenwire"
    tokenizer_version: str
    """The full id of the tokenizer version this model reads and writes."""
    max_model_len: int
    """Most tokens (prompt + completion) one request may hold."""


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(ResponseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(ResponseModel):
    error: ErrorInfo

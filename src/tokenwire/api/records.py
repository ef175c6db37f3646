"""Routes of what the server keeps: stored chat completions and responses (OpenAI's endpoints)
and documents.

Reads take `?format=text|tokens|both` (a response: OpenAI's `include[]`); lists take OpenAI's
`after`, `limit`, `order` (and, for completions, `model` and `metadata[KEY]=VALUE`). Query
parameters are checked like bodies: an unknown one or a bad value is a 400 naming it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, cast, get_args

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import InvalidRequestError, UnsupportedParameterError
from ..protocol.storage import (
    MAX_METADATA_PAIRS,
    DocumentSearchRequest,
    NewDocument,
    ReadFormat,
    UpdateCompletion,
)
from ..serving.documents import DocumentService
from ..serving.responses import StoredResponses
from ..serving.stored_completions import StoredCompletions
from ._json import ModelResponse
from .middleware import caller_of
from .validation import parse_body

__all__ = ["path_param", "query_params", "record_routes", "stored_completions", "stored_responses"]



def query_params(request: Request, allowed: Iterable[str]) -> dict[str, str]:
    """Single-valued query parameters, each one known (`metadata[...]` kept as it is; the
    repeated `include[]` is read by `_include`)."""
    known = set(allowed)
    out: dict[str, str] = {}
    for key, value in request.query_params.multi_items():
        if key == "include[]" and key in known:
            continue
        if "\x00" in key or "\x00" in value:
            raise InvalidRequestError("query parameters cannot hold NUL characters",
                                      param=key.replace("\x00", ""))
        name = "metadata" if key.startswith("metadata[") and key.endswith("]") else key
        if name not in known:
            raise InvalidRequestError(f"unknown query parameter {key!r}", param=key,
                                      code="unknown_parameter")
        if key in out:
            raise InvalidRequestError(f"query parameter {key!r} is given twice", param=key)
        out[key] = value
    return out


def path_param(request: Request, name: str) -> str:
    """A path parameter (an id): NUL cannot be in any id, nor in a PostgreSQL string."""
    value: str = request.path_params[name]
    if "\x00" in value:
        raise InvalidRequestError("ids cannot hold NUL characters", param=name)
    return value


def _format(q: dict[str, str]) -> ReadFormat | None:
    fmt = q.get("format")
    if fmt is not None and fmt not in get_args(ReadFormat):
        raise InvalidRequestError("format must be text, tokens or both", param="format",
                                  code="invalid_value")
    return cast(ReadFormat | None, fmt)


def _page(q: dict[str, str], *, default_limit: int = 20) -> dict[str, Any]:
    raw = q.get("limit", str(default_limit))
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 100:
        raise InvalidRequestError("limit must be an integer from 1 to 100", param="limit",
                                  code="invalid_value")
    order = q.get("order", "asc")
    if order not in ("asc", "desc"):
        raise InvalidRequestError("order must be asc or desc", param="order",
                                  code="invalid_value")
    return {"after": q.get("after"), "limit": int(raw),
            "order": cast(Literal["asc", "desc"], order)}


def _metadata(q: dict[str, str]) -> dict[str, str] | None:
    pairs = {k[len("metadata["):-1]: v for k, v in q.items() if k.startswith("metadata[")}
    if len(pairs) > MAX_METADATA_PAIRS:
        raise InvalidRequestError(f"at most {MAX_METADATA_PAIRS} metadata pairs",
                                  param="metadata")
    return pairs or None


def _include(request: Request) -> list[str]:
    """OpenAI's `include[]=a&include[]=b` (how its SDK sends a list)."""
    return request.query_params.getlist("include[]")


def stored_completions(request: Request) -> StoredCompletions:
    stored: StoredCompletions | None = request.app.state.stored
    if stored is None:
        raise UnsupportedParameterError("this server keeps no records (no storage)",
                                        param="store")
    return stored


def stored_responses(request: Request) -> StoredResponses:
    stored: StoredResponses | None = request.app.state.responses.stored
    if stored is None:
        raise UnsupportedParameterError("this server keeps no responses (no storage)",
                                        param="store")
    return stored


def _documents(request: Request) -> DocumentService:
    documents: DocumentService | None = request.app.state.documents
    if documents is None:
        raise UnsupportedParameterError("this server keeps no documents (no storage)",
                                        param="documents")
    return documents


# -- stored chat completions ----------------------------------------------------------------


async def list_completions(request: Request) -> Response:
    q = query_params(request, ("after", "limit", "order", "model", "metadata", "format"))
    return ModelResponse(await stored_completions(request).list(
        caller_of(request), model=q.get("model"), metadata=_metadata(q), fmt=_format(q),
        **_page(q)))


async def get_completion(request: Request) -> Response:
    q = query_params(request, ("format",))
    return ModelResponse(await stored_completions(request).get(
        path_param(request, "completion_id"), caller_of(request), _format(q)))


async def update_completion(request: Request) -> Response:
    query_params(request, ())
    req = parse_body(await request.body(), UpdateCompletion)
    return ModelResponse(await stored_completions(request).update(
        path_param(request, "completion_id"), caller_of(request), req.metadata or {}))


async def delete_completion(request: Request) -> Response:
    query_params(request, ())
    return ModelResponse(await stored_completions(request).delete(
        path_param(request, "completion_id"), caller_of(request)))


async def completion_messages(request: Request) -> Response:
    q = query_params(request, ("after", "limit", "order", "format"))
    return ModelResponse(await stored_completions(request).messages(
        path_param(request, "completion_id"), caller_of(request), fmt=_format(q), **_page(q)))


# -- stored responses -------------------------------------------------------------------------


async def get_response(request: Request) -> Response:
    # `include_obfuscation` only concerns a stream, which a stored read is not
    query_params(request, ("include[]", "include_obfuscation"))
    return ModelResponse(await stored_responses(request).get(
        path_param(request, "response_id"), caller_of(request), _include(request)))


async def delete_response(request: Request) -> Response:
    query_params(request, ())
    return ModelResponse(await stored_responses(request).delete(
        path_param(request, "response_id"), caller_of(request)))


async def response_input_items(request: Request) -> Response:
    q = query_params(request, ("after", "limit", "order"))
    return ModelResponse(await stored_responses(request).input_items(
        path_param(request, "response_id"), caller_of(request),
        **_page({"order": "desc", **q})))  # OpenAI's default order here


# -- documents --------------------------------------------------------------------------------


async def create_document(request: Request) -> Response:
    query_params(request, ())
    req = parse_body(await request.body(), NewDocument)
    return ModelResponse(await _documents(request).create(req, caller_of(request)))


async def get_document(request: Request) -> Response:
    q = query_params(request, ("format",))
    return ModelResponse(await _documents(request).get(
        path_param(request, "document_id"), caller_of(request), _format(q) or "tokens"))


async def delete_document(request: Request) -> Response:
    query_params(request, ())
    return ModelResponse(await _documents(request).delete(
        path_param(request, "document_id"), caller_of(request)))


async def search_documents(request: Request) -> Response:
    query_params(request, ())
    req = parse_body(await request.body(), DocumentSearchRequest)
    return ModelResponse(await _documents(request).search(req, caller_of(request)))


record_routes = [
    Route("/v1/chat/completions", list_completions, methods=["GET"]),
    Route("/v1/chat/completions/{completion_id}", get_completion, methods=["GET"]),
    Route("/v1/chat/completions/{completion_id}", update_completion, methods=["POST"]),
    Route("/v1/chat/completions/{completion_id}", delete_completion, methods=["DELETE"]),
    Route("/v1/chat/completions/{completion_id}/messages", completion_messages,
          methods=["GET"]),
    Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/input_items", response_input_items, methods=["GET"]),
    Route("/v1/documents", create_document, methods=["POST"]),
    Route("/v1/documents/search", search_documents, methods=["POST"]),
    Route("/v1/documents/{document_id}", get_document, methods=["GET"]),
    Route("/v1/documents/{document_id}", delete_document, methods=["DELETE"]),
]
"""After the generating routes: `POST /v1/chat/completions/render` is matched first."""

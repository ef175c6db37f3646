"""What the sync and async clients share: request bodies, response parsing, SSE decoding.

No I/O here, so the two clients differ only in `await`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from ..errors import error_from_body
from ..protocol._base import PackedIds
from ..protocol.control import CONTROL_OPS, ROLLING_UPDATE

__all__ = [
    "DONE",
    "chat_body",
    "compact_body",
    "control_target",
    "completion_body",
    "decode_sse_line",
    "raise_for_error",
    "wants_version",
    "wire_messages",
]

DONE = object()
"""What `decode_sse_line` returns for `data: [DONE]`."""

M = TypeVar("M", bound=BaseModel)

#: the client is token-native: it asks for ids unless told otherwise
TOKEN_DEFAULTS: dict[str, Any] = {"response_format_tokens": True, "return_token_ids": True}


def _content(content: Any) -> Any:
    """A list of ints is an input_tokens block; anything else goes as given."""
    if isinstance(content, list) and content and all(
        isinstance(t, int) and not isinstance(t, bool) for t in content
    ):
        return {"type": "input_tokens", "token_ids": list(content)}
    return content


def _message(m: Any) -> dict[str, Any]:
    if isinstance(m, BaseModel):
        return m.model_dump(exclude_none=True)
    out = dict(m)
    if "content" in out:
        out["content"] = _content(out["content"])
    return out


def _has_ids(messages: Iterable[Mapping[str, Any]]) -> bool:
    for m in messages:
        c = m.get("content")
        blocks = c if isinstance(c, list) else [c]
        if m.get("token_ids") is not None or any(
            isinstance(b, dict) and b.get("type") == "input_tokens" for b in blocks
        ):
            return True
    return False


def wire_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    return [_message(m) for m in messages]


def chat_body(model: str, messages: Sequence[Any], params: dict[str, Any]) -> dict[str, Any]:
    return {"model": model, "messages": wire_messages(messages), **TOKEN_DEFAULTS, **params}


def control_target(base_url: httpx.URL, op: str, query: Mapping[str, Any]) -> tuple[str, str]:
    """(method, absolute URL) of a control call: vLLM's paths, at the server's root (beside
    `/v1`, not under it)."""
    method, path = ROLLING_UPDATE if op == "rolling_update" else CONTROL_OPS[op]
    root = str(base_url).rstrip("/").removesuffix("/v1")
    params = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in query.items()}
    return method, str(httpx.URL(root + path, params=params))


def completion_body(model: str, prompt: Any, params: dict[str, Any]) -> dict[str, Any]:
    defaults = {"return_token_ids": True}
    return {"model": model, "prompt": prompt, **defaults, **params}


def document_body(text: str | None, token_ids: Sequence[int] | None,
                  tokenizer_version: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"text": text} if token_ids is None else \
        {"token_ids": list(token_ids)}
    if tokenizer_version is not None:
        body["tokenizer_version"] = tokenizer_version
    return body


def search_body(query: str | Sequence[int], tokenizer_version: str | None,
                limit: int) -> dict[str, Any]:
    """A text query (encoded by the server), or ids, whose version must be named."""
    if isinstance(query, str):
        body: dict[str, Any] = {"query": query}
        if tokenizer_version is not None:
            body["tokenizer_version"] = tokenizer_version
    else:
        body = {"query": {"token_ids": list(query), "tokenizer_version": tokenizer_version}}
    return {**body, "limit": limit}


def _packed(ids: Any) -> Any:
    """A list of ids as base64; anything else as it was (the server says what is wrong)."""
    if isinstance(ids, list) and all(type(t) is int and 0 <= t < 2**31 for t in ids):
        return PackedIds(ids).text
    return ids


def _pack_message(m: Any) -> Any:
    """A message with an assistant's `token_ids` and its `input_tokens` blocks packed (nothing
    else: a tool's schema may hold a `token_ids` of its own)."""
    if not isinstance(m, dict):
        return m
    out = dict(m)
    if "token_ids" in out:
        out["token_ids"] = _packed(out["token_ids"])
    if "content" in out:
        content = out["content"]
        blocks = content if isinstance(content, list) else [content]
        packed = [{**b, "token_ids": _packed(b["token_ids"])}
                  if isinstance(b, dict) and b.get("type") in ("input_tokens", "token_ids")
                  and "token_ids" in b else b for b in blocks]
        out["content"] = packed if isinstance(content, list) else packed[0]
    return out


def compact_body(body: dict[str, Any], ids_key: str | None = None) -> dict[str, Any]:
    """`body` with the ids its messages send as base64 of int32 (`ids_key`: a top-level list
    of ids, detokenize's `tokens`) and its answer's asked for so (`encoding_format`): the
    client reads either into the same lists."""
    out = dict(body)
    if isinstance(out.get("messages"), list):
        out["messages"] = [_pack_message(m) for m in out["messages"]]
    if ids_key is not None and ids_key in out:
        out[ids_key] = _packed(out[ids_key])
    out.setdefault("encoding_format", "base64")
    return out


def wants_version(body: Mapping[str, Any]) -> bool:
    """Does this body send ids without naming their version (the client fills it in)?"""
    if body.get("tokenizer_version") is not None:
        return False
    if "messages" in body:
        return _has_ids(body["messages"])
    p = body.get("prompt")
    return isinstance(p, list) and bool(p) and not isinstance(p[0], str)


def raise_for_error(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = {"error": {"message": response.text or response.reason_phrase}}
    raise error_from_body(response.status_code, body)


def decode_sse_line(line: str, model: type[M]) -> M | object | None:
    """One SSE line -> a chunk; None for other lines; `DONE` at the end; an in-band error is
    raised as its typed exception."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return DONE
    body = json.loads(data)
    if isinstance(body, dict) and "error" in body:
        # in-band: the status was already 200; the code picks the class
        raise error_from_body(500, body)
    return model.model_validate(body)

"""`Client` and `AsyncClient`: the Python SDK, on the same protocol models as the server.

Both ask for token ids by default (`response_format_tokens`, `return_token_ids`), fill in the
model's `tokenizer_version` when a request sends ids without one (asking the server, never
guessing), and tokenize locally with the exact artifact the server publishes, verified by its
fingerprint and hash.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar, overload
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from ..errors import APIConnectionError
from ..protocol.chat import ChatCompletion, ChatCompletionChunk
from ..protocol.common import ModelCard, ModelList
from ..protocol.completions import Completion, CompletionChunk
from ..protocol.render import RenderResponse
from ..protocol.storage import (
    DeletedDocument,
    Document,
    DocumentCreated,
    DocumentSearchResults,
    ReadFormat,
)
from ..protocol.tokenize import DetokenizeResponse, TokenizeResponse, TokenizerInfo, TokenizerList
from ..tokenizers.base import VERSION_RE
from ..tokenizers.hf import HFTokenizer
from ._common import (
    chat_body,
    compact_body,
    completion_body,
    control_target,
    document_body,
    raise_for_error,
    search_body,
    wants_version,
    wire_messages,
)
from ._streaming import AsyncStream, Stream
from ._tokenizers import TokenizerCache

__all__ = ["DEFAULT_BASE_URL", "AsyncClient", "Client"]

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
M = TypeVar("M", bound=BaseModel)


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _tokenize_body(prompt: str | None, messages: Sequence[Any] | None, model: str | None,
                   tokenizer_version: str | None, params: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {k: v for k, v in {
        "model": model, "tokenizer_version": tokenizer_version, "prompt": prompt,
    }.items() if v is not None}
    if messages is not None:
        body["messages"] = wire_messages(messages)
    return {**body, **params}


class _Base:
    def __init__(self, cache_dir: Path | None, compact_ids: bool):
        self._tokenizers = TokenizerCache(cache_dir)
        self._versions: dict[str, str] = {}
        self._compact = compact_ids

    def _body(self, body: dict[str, Any], ids_key: str | None = None) -> dict[str, Any]:
        """`body` as sent: with `compact_ids`, its ids and its answer's as base64."""
        return compact_body(body, ids_key) if self._compact else body

    @staticmethod
    def _parse(response: httpx.Response, model: type[M]) -> M:
        return model.model_validate_json(response.content)


class Client(_Base):
    def __init__(self, base_url: str = DEFAULT_BASE_URL, *, api_key: str | None = None,
                 timeout: float = 600.0, cache_dir: Path | None = None,
                 http_client: httpx.Client | None = None, compact_ids: bool = False):
        """`compact_ids`: ids go both ways as base64 of int32 (`encoding_format: "base64"`),
        read into the same lists: no number parsed per id (not fewer bytes: docs/api.md)."""
        super().__init__(cache_dir, compact_ids)
        self._http = http_client or httpx.Client(base_url=base_url, timeout=timeout,
                                                 headers=_headers(api_key))

    # -- plumbing --------------------------------------------------------------------------

    def _send(self, method: str, path: str, *, json: Any = None, stream: bool = False,
              ) -> httpx.Response:
        try:
            request = self._http.build_request(method, path.lstrip("/"), json=json)
            response = self._http.send(request, stream=stream)
        except httpx.HTTPError as exc:
            raise APIConnectionError(f"{method} {path} failed: {exc}") from exc
        if response.status_code >= 400 and stream:
            response.read()
        raise_for_error(response)
        return response

    def _with_version(self, body: dict[str, Any]) -> dict[str, Any]:
        if wants_version(body):
            body["tokenizer_version"] = self.tokenizer_version(body["model"])
        return body

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- models and tokenizers ---------------------------------------------------------------

    def models(self) -> list[ModelCard]:
        return self._parse(self._send("GET", "models"), ModelList).data

    def tokenizer_version(self, model: str) -> str:
        """The full tokenizer version a model reads and writes (asked once, then cached)."""
        if model not in self._versions:
            card = self._parse(self._send("GET", f"models/{model}"), ModelCard)
            self._versions[model] = card.tokenizer_version
        return self._versions[model]

    def tokenizers(self) -> list[TokenizerInfo]:
        return self._parse(self._send("GET", "tokenizers"), TokenizerList).data

    def tokenizer(self, version: str | None = None, *, model: str | None = None,
                  ) -> HFTokenizer:
        """The tokenizer of a version (or of a model), verified and cached on disk, for
        encoding and decoding locally with exactly the server's ids. An id issued before
        the fingerprint is checked against its artifact's sha256 where the cache holds those
        bytes; else the server names the version it is now, as it does for an alias, and the
        bytes are checked against that (`TokenizerCache.verify`)."""
        if version is None:
            if model is None:
                raise ValueError("name a tokenizer version or a model")
            version = self.tokenizer_version(model)
        info = None
        if not VERSION_RE.match(version):  # an alias: ask which version it names now
            info = self._parse(self._send("GET", f"tokenizers/{version}"), TokenizerInfo)
            version = info.id
        cached = self._tokenizers.get(version)
        if cached is not None:
            return cached
        if info is None:  # its entry says how the bytes encode text (`text_encoding`)
            info = self._parse(self._send("GET", f"tokenizers/{version}"), TokenizerInfo)
            if info.id != version:  # an id from before the fingerprint: the server says which
                tok = self.tokenizer(info.id)  # version it is now (as it does an alias's)
                self._tokenizers.remember(version, tok)
                return tok
        r = self._send("GET", f"tokenizers/{version}/tokenizer.json")
        return self._tokenizers.put(version, r.content, r.headers.get("x-tokenwire-sha256"),
                                    info.text_encoding)

    def tokenize(self, prompt: str | None = None, *, messages: Sequence[Any] | None = None,
                 model: str | None = None, tokenizer_version: str | None = None,
                 **params: Any) -> TokenizeResponse:
        body = self._body(_tokenize_body(prompt, messages, model, tokenizer_version, params))
        return self._parse(self._send("POST", "tokenize", json=body), TokenizeResponse)

    def detokenize(self, tokens: Sequence[int], *, model: str | None = None,
                   tokenizer_version: str | None = None) -> DetokenizeResponse:
        if tokenizer_version is None and model is not None:
            tokenizer_version = self.tokenizer_version(model)
        body = self._body({"tokens": list(tokens), "tokenizer_version": tokenizer_version},
                          "tokens")
        body.pop("encoding_format", None)  # the answer is text
        return self._parse(self._send("POST", "detokenize", json=body), DetokenizeResponse)

    # -- documents (held as ids by the server) ------------------------------------------------

    def add_document(self, text: str | None = None, *, token_ids: Sequence[int] | None = None,
                     tokenizer_version: str | None = None) -> DocumentCreated:
        """Store text (encoded once, by the server) or ids of `tokenizer_version`."""
        body = document_body(text, token_ids, tokenizer_version)
        return self._parse(self._send("POST", "documents", json=body), DocumentCreated)

    def document(self, document_id: str, *, format: ReadFormat = "tokens") -> Document:
        r = self._send("GET", f"documents/{quote(document_id, safe='')}?format={format}")
        return self._parse(r, Document)

    def delete_document(self, document_id: str) -> DeletedDocument:
        r = self._send("DELETE", f"documents/{quote(document_id, safe='')}")
        return self._parse(r, DeletedDocument)

    def search_documents(self, query: str | Sequence[int], *,
                         tokenizer_version: str | None = None,
                         limit: int = 10) -> DocumentSearchResults:
        """Documents ranked by BM25 over ids: `query` as text, or ids of `tokenizer_version`."""
        body = search_body(query, tokenizer_version, limit)
        return self._parse(self._send("POST", "documents/search", json=body),
                           DocumentSearchResults)

    # -- generation -----------------------------------------------------------------------

    @overload
    def chat(self, model: str, messages: Sequence[Any], *, stream: Literal[False] = ...,
             **params: Any) -> ChatCompletion: ...

    @overload
    def chat(self, model: str, messages: Sequence[Any], *, stream: Literal[True],
             **params: Any) -> Stream[ChatCompletionChunk]: ...

    def chat(self, model: str, messages: Sequence[Any], *, stream: bool = False,
             **params: Any) -> ChatCompletion | Stream[ChatCompletionChunk]:
        """A chat completion. A message's content may be text, a list of ids, or blocks;
        an assistant message may carry the `token_ids` an earlier response returned."""
        body = self._body(self._with_version(chat_body(model, messages,
                                                       {"stream": stream, **params})))
        r = self._send("POST", "chat/completions", json=body, stream=stream)
        if stream:
            return Stream(r, ChatCompletionChunk)
        return self._parse(r, ChatCompletion)

    def render(self, model: str, messages: Sequence[Any], **params: Any) -> RenderResponse:
        """The prompt a chat request with these messages runs with, where each message went,
        and `sampled_mask`: which ids the model sampled (the loss mask of RL training)."""
        body = self._body(self._with_version({"model": model,
                                              "messages": wire_messages(messages), **params}))
        return self._parse(self._send("POST", "chat/completions/render", json=body),
                           RenderResponse)

    # -- the control plane (admin keys only) --------------------------------------------------

    def control(self, op: str, body: dict[str, Any] | None = None,
                **query: Any) -> dict[str, Any]:
        """A control-plane call for every replica at once (vLLM's RL endpoints by name:
        `pause` with `mode=`, `resume`, `update_weights`, `update_weight_version`,
        `weight_info`, `reset_prefix_cache`, ...; and tokenwire's `rolling_update`); vLLM's
        answer, plus `replicas`."""
        method, url = control_target(self._http.base_url, op, query)
        result: dict[str, Any] = self._send(method, url, json=body).json()
        return result

    @overload
    def complete(self, model: str, prompt: str | Sequence[Any], *,
                 stream: Literal[False] = ..., **params: Any) -> Completion: ...

    @overload
    def complete(self, model: str, prompt: str | Sequence[Any], *, stream: Literal[True],
                 **params: Any) -> Stream[CompletionChunk]: ...

    def complete(self, model: str, prompt: str | Sequence[Any], *, stream: bool = False,
                 **params: Any) -> Completion | Stream[CompletionChunk]:
        """A legacy completion of text, ids, or several of either."""
        # (a string prompt is text: prompt ids go as a list, the answer's come as base64)
        body = self._body(self._with_version(completion_body(model, prompt,
                                                             {"stream": stream, **params})))
        r = self._send("POST", "completions", json=body, stream=stream)
        if stream:
            return Stream(r, CompletionChunk)
        return self._parse(r, Completion)


class AsyncClient(_Base):
    def __init__(self, base_url: str = DEFAULT_BASE_URL, *, api_key: str | None = None,
                 timeout: float = 600.0, cache_dir: Path | None = None,
                 http_client: httpx.AsyncClient | None = None, compact_ids: bool = False):
        """See `Client`."""
        super().__init__(cache_dir, compact_ids)
        self._http = http_client or httpx.AsyncClient(base_url=base_url, timeout=timeout,
                                                      headers=_headers(api_key))

    async def _send(self, method: str, path: str, *, json: Any = None, stream: bool = False,
                    ) -> httpx.Response:
        try:
            request = self._http.build_request(method, path.lstrip("/"), json=json)
            response = await self._http.send(request, stream=stream)
        except httpx.HTTPError as exc:
            raise APIConnectionError(f"{method} {path} failed: {exc}") from exc
        if response.status_code >= 400 and stream:
            await response.aread()
        raise_for_error(response)
        return response

    async def _with_version(self, body: dict[str, Any]) -> dict[str, Any]:
        if wants_version(body):
            body["tokenizer_version"] = await self.tokenizer_version(body["model"])
        return body

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def models(self) -> list[ModelCard]:
        return self._parse(await self._send("GET", "models"), ModelList).data

    async def tokenizer_version(self, model: str) -> str:
        if model not in self._versions:
            card = self._parse(await self._send("GET", f"models/{model}"), ModelCard)
            self._versions[model] = card.tokenizer_version
        return self._versions[model]

    async def tokenizers(self) -> list[TokenizerInfo]:
        return self._parse(await self._send("GET", "tokenizers"), TokenizerList).data

    async def tokenizer(self, version: str | None = None, *, model: str | None = None,
                        ) -> HFTokenizer:
        if version is None:
            if model is None:
                raise ValueError("name a tokenizer version or a model")
            version = await self.tokenizer_version(model)
        info = None
        if not VERSION_RE.match(version):
            info = self._parse(await self._send("GET", f"tokenizers/{version}"), TokenizerInfo)
            version = info.id
        # reading, hashing, building and writing a tokenizer take a worker thread: the event
        # loop (and every other request on it) keeps turning meanwhile
        cached = await asyncio.to_thread(self._tokenizers.get, version)
        if cached is not None:
            return cached
        if info is None:
            info = self._parse(await self._send("GET", f"tokenizers/{version}"), TokenizerInfo)
            if info.id != version:  # an id from before the fingerprint (see `Client`)
                tok = await self.tokenizer(info.id)
                self._tokenizers.remember(version, tok)
                return tok
        r = await self._send("GET", f"tokenizers/{version}/tokenizer.json")
        return await asyncio.to_thread(self._tokenizers.put, version, r.content,
                                       r.headers.get("x-tokenwire-sha256"), info.text_encoding)

    async def tokenize(self, prompt: str | None = None, *,
                       messages: Sequence[Any] | None = None, model: str | None = None,
                       tokenizer_version: str | None = None,
                       **params: Any) -> TokenizeResponse:
        body = self._body(_tokenize_body(prompt, messages, model, tokenizer_version, params))
        return self._parse(await self._send("POST", "tokenize", json=body), TokenizeResponse)

    async def detokenize(self, tokens: Sequence[int], *, model: str | None = None,
                         tokenizer_version: str | None = None) -> DetokenizeResponse:
        if tokenizer_version is None and model is not None:
            tokenizer_version = await self.tokenizer_version(model)
        body = self._body({"tokens": list(tokens), "tokenizer_version": tokenizer_version},
                          "tokens")
        body.pop("encoding_format", None)  # the answer is text
        r = await self._send("POST", "detokenize", json=body)
        return self._parse(r, DetokenizeResponse)

    async def add_document(self, text: str | None = None, *,
                           token_ids: Sequence[int] | None = None,
                           tokenizer_version: str | None = None) -> DocumentCreated:
        """Store text (encoded once, by the server) or ids of `tokenizer_version`."""
        body = document_body(text, token_ids, tokenizer_version)
        return self._parse(await self._send("POST", "documents", json=body), DocumentCreated)

    async def document(self, document_id: str, *, format: ReadFormat = "tokens") -> Document:
        r = await self._send("GET", f"documents/{quote(document_id, safe='')}?format={format}")
        return self._parse(r, Document)

    async def delete_document(self, document_id: str) -> DeletedDocument:
        r = await self._send("DELETE", f"documents/{quote(document_id, safe='')}")
        return self._parse(r, DeletedDocument)

    async def search_documents(self, query: str | Sequence[int], *,
                               tokenizer_version: str | None = None,
                               limit: int = 10) -> DocumentSearchResults:
        """Documents ranked by BM25 over ids: `query` as text, or ids of `tokenizer_version`."""
        body = search_body(query, tokenizer_version, limit)
        return self._parse(await self._send("POST", "documents/search", json=body),
                           DocumentSearchResults)

    @overload
    async def chat(self, model: str, messages: Sequence[Any], *,
                   stream: Literal[False] = ..., **params: Any) -> ChatCompletion: ...

    @overload
    async def chat(self, model: str, messages: Sequence[Any], *, stream: Literal[True],
                   **params: Any) -> AsyncStream[ChatCompletionChunk]: ...

    async def chat(self, model: str, messages: Sequence[Any], *, stream: bool = False,
                   **params: Any) -> ChatCompletion | AsyncStream[ChatCompletionChunk]:
        body = self._body(await self._with_version(chat_body(model, messages,
                                                             {"stream": stream, **params})))
        r = await self._send("POST", "chat/completions", json=body, stream=stream)
        if stream:
            return AsyncStream(r, ChatCompletionChunk)
        return self._parse(r, ChatCompletion)

    async def render(self, model: str, messages: Sequence[Any],
                     **params: Any) -> RenderResponse:
        """See `Client.render`."""
        body = self._body(await self._with_version({
            "model": model, "messages": wire_messages(messages), **params}))
        return self._parse(await self._send("POST", "chat/completions/render", json=body),
                           RenderResponse)

    async def control(self, op: str, body: dict[str, Any] | None = None,
                      **query: Any) -> dict[str, Any]:
        """See `Client.control`."""
        method, url = control_target(self._http.base_url, op, query)
        result: dict[str, Any] = (await self._send(method, url, json=body)).json()
        return result

    @overload
    async def complete(self, model: str, prompt: str | Sequence[Any], *,
                       stream: Literal[False] = ..., **params: Any) -> Completion: ...

    @overload
    async def complete(self, model: str, prompt: str | Sequence[Any], *,
                       stream: Literal[True], **params: Any) -> AsyncStream[CompletionChunk]: ...

    async def complete(self, model: str, prompt: str | Sequence[Any], *, stream: bool = False,
                       **params: Any) -> Completion | AsyncStream[CompletionChunk]:
        body = self._body(await self._with_version(completion_body(
            model, prompt, {"stream": stream, **params})))
        r = await self._send("POST", "completions", json=body, stream=stream)
        if stream:
            return AsyncStream(r, CompletionChunk)
        return self._parse(r, Completion)

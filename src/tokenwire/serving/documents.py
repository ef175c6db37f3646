"""Documents held as ids: stored, read back, searched in id space, spliced into chat prompts.

A document is kept in the version it was sent in (text is encoded once, on the way in). Search
compares ids with ids (BM25 whose terms are token ids), so a query sent as ids converts
nothing; a chat `input_document` block reads the ids straight from storage, translated only
when the document's version is not the request's (the response then says so).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence

from ..errors import DocumentNotFoundError, InvalidRequestError
from ..protocol.chat import ChatCompletionRequest, ChatMessage, InputDocumentBlock, InputTokensBlock
from ..protocol.common import ResponseWarning
from ..protocol.storage import (
    DeletedDocument,
    Document,
    DocumentCreated,
    DocumentQuery,
    DocumentSearchHit,
    DocumentSearchRequest,
    DocumentSearchResults,
    NewDocument,
    ReadFormat,
)
from ..storage import Store
from ..storage import base as stored
from ..storage.search import IdIndex
from ..tokenizers.conversions import conversion_reason
from ..tokenizers.registry import TokenizerEntry, TokenizerRegistry
from ..tokenizers.translate import translator
from .models import ModelRegistry
from .service import Caller
from .tokens import IdSpan, check_id_range, check_special_ids

__all__ = ["MAX_DOCUMENTS", "DocumentService"]

MAX_DOCUMENTS = 64
"""`input_document` blocks one chat request may hold (each is a read of the store)."""


class SearchIndexes:
    """One BM25 index per (owner, version), rebuilt when that owner's documents of that
    version are not the ones it was built from. The documents are listed from the store on
    each search, so what another gateway stored in a shared database is found too (the cost:
    one read of the owner's documents per search, per id the version has had: its legacy ids
    name documents stored by releases before the fingerprint). The most recently used `keep`
    indexes are kept in memory."""

    def __init__(self, store: Store, keep: int = 64):
        self._store = store
        self._keep = keep
        self._built: OrderedDict[tuple[str, str], tuple[frozenset[str], IdIndex]] = \
            OrderedDict()

    async def search(self, owner: str, entry: TokenizerEntry, ids: list[int], limit: int, *,
                     ignore: frozenset[int]) -> list[tuple[str, float]]:
        # documents stored under an id the version had before the fingerprint are its too
        docs = [d for v in (entry.version, *sorted(entry.legacy))
                for d in await self._store.documents(owner, v)]
        docs.sort(key=lambda d: d.created)  # oldest first, as one version's come
        have = frozenset(d.id for d in docs)
        key = (owner, entry.version)
        built = self._built.get(key)
        if built is None or built[0] != have:
            built = (have, await asyncio.to_thread(_index, docs, ignore))
        self._built[key] = built
        self._built.move_to_end(key)
        while len(self._built) > self._keep:
            self._built.popitem(last=False)
        return await asyncio.to_thread(built[1].search, ids, limit)


def _index(docs: Sequence[stored.Document], ignore: frozenset[int]) -> IdIndex:
    index = IdIndex(ignore=ignore)
    for d in docs:
        index.add(d.id, d.token_ids)
    return index


class DocumentService:
    def __init__(self, store: Store, models: ModelRegistry, tokenizers: TokenizerRegistry):
        self._store = store
        self._models = models
        self._tokenizers = tokenizers
        self._indexes = SearchIndexes(store)

    def _version(self, name: str | None, *, param: str = "tokenizer_version") -> TokenizerEntry:
        """A named version, or the one every served model shares (text needs one to be encoded
        with)."""
        if name is not None:
            return self._tokenizers.resolve(name, param=param)
        served = {m.tokenizer_entry.version: m.tokenizer_entry for m in self._models.all()}
        if len(served) != 1:
            raise InvalidRequestError(
                "name the tokenizer_version: the served models use " + ", ".join(sorted(served)),
                param=param, code="missing_required_parameter")
        return next(iter(served.values()))

    @staticmethod
    def _check_ids(ids: list[int], entry: TokenizerEntry, param: str) -> None:
        # the ids of a document become prompt content: no control tokens, as in input_tokens
        spans = [IdSpan(param, ids, False)]
        check_id_range(spans, entry.tokenizer)
        check_special_ids(spans, entry.tokenizer,
                          hint="a document is content; its ids cannot be control tokens")

    async def create(self, req: NewDocument, caller: Caller) -> DocumentCreated:
        if req.token_ids is not None:
            if req.tokenizer_version is None:
                raise InvalidRequestError("documents sent as ids must name their "
                                          "tokenizer_version", param="tokenizer_version",
                                          code="missing_required_parameter")
            entry = self._version(req.tokenizer_version)
            ids = req.token_ids
            self._check_ids(ids, entry, "token_ids")
        else:
            entry = self._version(req.tokenizer_version)
            assert req.text is not None
            with conversion_reason("document"):
                ids = await asyncio.to_thread(entry.tokenizer.encode, req.text)
        doc = stored.Document(id=f"doc-{uuid.uuid4().hex}", owner=caller.owner,
                              tokenizer_version=entry.version, token_ids=ids,
                              created=int(time.time()), vocab_size=entry.tokenizer.vocab_size)
        await self._store.put_document(doc)
        return DocumentCreated(id=doc.id, tokenizer_version=doc.tokenizer_version,
                               count=len(ids))

    async def _get(self, id: str, caller: Caller) -> stored.Document:
        doc = await self._store.get_document(caller.owner, id)
        if doc is None:
            raise DocumentNotFoundError(f"no document {id!r}")
        return doc

    async def get(self, id: str, caller: Caller, fmt: ReadFormat) -> Document:
        doc = await self._get(id, caller)
        text = None
        if fmt != "tokens":
            tok = self._tokenizers.resolve(doc.tokenizer_version).tokenizer
            with conversion_reason("document"):
                text = tok.decode(doc.token_ids)
        if fmt == "text":
            return Document(id=doc.id, text=text)
        return Document(id=doc.id, token_ids=doc.token_ids,
                        tokenizer_version=doc.tokenizer_version, text=text)

    async def delete(self, id: str, caller: Caller) -> DeletedDocument:
        """Gone from reads, searches (an index is rebuilt when its documents change) and
        `input_document` blocks; prompts already made from it keep their ids."""
        if not await self._store.delete_document(caller.owner, id):
            raise DocumentNotFoundError(f"no document {id!r}")
        return DeletedDocument(id=id, deleted=True)

    async def search(self, req: DocumentSearchRequest, caller: Caller) -> DocumentSearchResults:
        if isinstance(req.query, DocumentQuery):
            if req.tokenizer_version is not None:
                raise InvalidRequestError("an id query names its version in "
                                          "query.tokenizer_version", param="tokenizer_version")
            entry = self._version(req.query.tokenizer_version, param="query.tokenizer_version")
            ids = req.query.token_ids
            check_id_range([IdSpan("query.token_ids", ids, False)], entry.tokenizer)
        else:
            entry = self._version(req.tokenizer_version)
            with conversion_reason("search"):
                ids = await asyncio.to_thread(entry.tokenizer.encode, req.query)
        hits = await self._indexes.search(caller.owner, entry, ids, req.limit,
                                          ignore=entry.tokenizer.special_ids)
        return DocumentSearchResults(
            data=[DocumentSearchHit(document_id=d, score=s) for d, s in hits],
            tokenizer_version=entry.version)

    async def splice(self, req: ChatCompletionRequest, caller: Caller, model_version: str,
                     ) -> tuple[ChatCompletionRequest, list[ResponseWarning]]:
        """`req` with every `input_document` block replaced by the document's ids, in the
        request's version (its `tokenizer_version`, else the model's): read from storage, and
        translated (with a `document_translated` warning) only when the document's version
        differs. A request without documents comes back as it is."""
        where = [(i, j) for i, m in enumerate(req.messages) for j, b in enumerate(_blocks(m))
                 if isinstance(b, InputDocumentBlock)]
        if not where:
            return req, []
        if len(where) > MAX_DOCUMENTS:
            raise InvalidRequestError(f"at most {MAX_DOCUMENTS} input_document blocks per "
                                      "request", param="messages", code="invalid_value")
        fetched: dict[str, stored.Document | None] = {}
        target = (self._tokenizers.resolve(req.tokenizer_version).version
                  if req.tokenizer_version is not None else model_version)
        messages = list(req.messages)
        warnings: list[ResponseWarning] = []
        for i, j in where:
            m = messages[i]
            if m.token_ids is not None:
                continue  # the message's ids are used instead of its content
            blocks = list(_blocks(m))
            block = blocks[j]
            assert isinstance(block, InputDocumentBlock)
            param = f"messages[{i}].content" + (f"[{j}]" if isinstance(m.content, list) else "")
            if block.document_id not in fetched:
                fetched[block.document_id] = await self._store.get_document(
                    caller.owner, block.document_id)
            doc = fetched[block.document_id]
            if doc is None:
                raise DocumentNotFoundError(f"no document {block.document_id!r}",
                                            param=f"{param}.document_id")
            ids = doc.token_ids
            # (a document stored under an id of `target` from before the fingerprint is in it)
            held = self._tokenizers.resolve(doc.tokenizer_version)
            if held.version != target:
                src = held.tokenizer
                dst = self._tokenizers.resolve(target).tokenizer
                with conversion_reason("translate"):
                    tr = await asyncio.to_thread(translator(src, dst).translate, ids)
                ids = tr.token_ids
                warnings.append(ResponseWarning(
                    code="document_translated", param=param,
                    message=f"document {doc.id!r} is held in {doc.tokenizer_version}; its ids "
                            f"were translated into {target}"
                            + ("" if tr.lossless else " (not losslessly)")))
            blocks[j] = InputTokensBlock(type="input_tokens", token_ids=ids)
            messages[i] = m.model_copy(update={"content": blocks if isinstance(m.content, list)
                                               else blocks[0]})
        update: dict[str, object] = {"messages": messages}
        if req.tokenizer_version is None and not any(_carries_ids(m) for m in req.messages):
            # the spliced ids are the only ids: say which version they are in (other ids
            # without a version are left to the usual rule, `require_tokenizer_version`)
            update["tokenizer_version"] = target
        return req.model_copy(update=update), warnings


def _carries_ids(m: ChatMessage) -> bool:
    return m.token_ids is not None or any(isinstance(b, InputTokensBlock) for b in _blocks(m))


def _blocks(m: ChatMessage) -> Sequence[object]:
    c = m.content
    return c if isinstance(c, list) else [c]

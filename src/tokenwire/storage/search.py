"""BM25 over documents held as ids: the terms are token ids, so a search never leaves id space.

A document's ids are its terms as they are (no text is made, nothing is re-tokenized); a query
is ids of the same tokenizer version, so ids compare directly. Control ids (BOS/EOS, chat
markers) say nothing about content and are left out of both sides (`ignore`). Each query id
counts once (a repeated id weighs no more than one), and a document that shares no id with the
query is no hit.

Scoring is `bm25s` (Lucene's BM25 on a sparse matrix; it indexes ids and a vocabulary given to
it, never strings). Its indexes are static, so an `IdIndex` keeps the documents and rebuilds
the matrix at the first search after a change: adding documents costs nothing until then.
One index holds one owner's documents of one tokenizer version (ids of two versions are
different terms); the caller keeps one per (owner, version).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import bm25s
import numpy as np

__all__ = ["IdIndex"]


class _Built:
    """The static part: bm25s' matrix over the documents of one moment."""

    def __init__(self, docs: dict[str, list[int]]):
        self.ids = [d for d, terms in docs.items() if terms]  # a document without terms: no hit
        self.vocab: dict[int, int] = {}
        """Token id -> its column in the matrix (dense: only ids some document holds)."""
        corpus = [[self.vocab.setdefault(t, len(self.vocab)) for t in docs[d]] for d in self.ids]
        self.bm25 = bm25s.BM25()
        if corpus:
            self.bm25.index((corpus, dict(self.vocab)), create_empty_token=False,
                            show_progress=False)

    def scores(self, query: Sequence[int]) -> np.ndarray:
        columns = sorted({self.vocab[t] for t in query if t in self.vocab})
        if not columns:
            return np.zeros(len(self.ids), dtype=np.float32)
        return np.asarray(self.bm25.get_scores_from_ids(columns))


class IdIndex:
    def __init__(self, *, ignore: frozenset[int] = frozenset()):
        """`ignore`: ids that are never terms (the version's control ids)."""
        self._ignore = ignore
        self._docs: dict[str, list[int]] = {}
        self._built: _Built | None = None
        self._lock = threading.Lock()  # searches run in worker threads

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._docs

    def add(self, doc_id: str, ids: Sequence[int]) -> None:
        """Index a document (again, if `doc_id` is known: its ids are replaced)."""
        terms = [t for t in ids if t not in self._ignore]
        with self._lock:
            self._docs[doc_id] = terms
            self._built = None

    def remove(self, doc_id: str) -> None:
        """Forget a document (nothing happens if it is not indexed)."""
        with self._lock:
            if self._docs.pop(doc_id, None) is not None:
                self._built = None

    def search(self, query_ids: Sequence[int], limit: int) -> list[tuple[str, float]]:
        """The best `limit` documents for `query_ids`, as (doc_id, score), best first (ties:
        the earlier-added document first); only documents that share an id with the query."""
        if limit < 1:
            return []
        with self._lock:
            if self._built is None:
                self._built = _Built(self._docs)
            built = self._built
        if not built.ids:
            return []
        scores = built.scores([t for t in query_ids if t not in self._ignore])
        hits = np.flatnonzero(scores > 0)
        # stable: equal scores keep the order the documents were added in
        best = hits[np.argsort(-scores[hits], kind="stable")][:limit]
        return [(built.ids[i], float(scores[i])) for i in best]

"""BM25 in id space (storage/search.py) on the real SmolLM2 tokenizer's ids."""

from __future__ import annotations

import pytest

from tokenwire.storage.search import IdIndex
from tokenwire.tokenizers.conversions import conversions
from tokenwire.tokenizers.hf import HFTokenizer

CORPUS = {
    "cats": "Cats are small carnivorous mammals. A cat purrs, hunts mice and sleeps most of "
            "the day; feed your cat twice a day.",
    "dogs": "Dogs are loyal companions. A dog needs a walk every day and barks at strangers.",
    "stocks": "The stock market fell today as investors sold shares of technology companies.",
    "python": "Python is a programming language; its interpreter runs scripts and modules.",
    "volcano": "A volcano erupts when magma rises through the crust and lava flows downhill.",
}


@pytest.fixture
def docs(tok: HFTokenizer) -> dict[str, list[int]]:
    return {k: tok.encode(v) for k, v in CORPUS.items()}


@pytest.fixture
def index(tok: HFTokenizer, docs: dict[str, list[int]]) -> IdIndex:
    ix = IdIndex(ignore=tok.special_ids)
    for doc_id, ids in docs.items():
        ix.add(doc_id, ids)
    return ix


@pytest.mark.parametrize(("query", "want"), [
    ("How often should I feed my cat?", "cats"),
    ("Which shares did investors sell on the stock market?", "stocks"),
    ("What happens when lava and magma erupt from a volcano?", "volcano"),
    ("How do I run a Python script?", "python"),
])
def test_the_relevant_document_ranks_first(tok: HFTokenizer, index: IdIndex, query: str,
                                           want: str) -> None:
    hits = index.search(tok.encode(query), limit=5)
    assert hits[0][0] == want
    scores = [s for _, s in hits]
    assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)
    assert len({d for d, _ in hits}) == len(hits)


def test_the_limit_is_honoured(tok: HFTokenizer, index: IdIndex) -> None:
    query = tok.encode("a day of cats, dogs, stocks and the market")
    everything = index.search(query, limit=100)
    assert len(everything) >= 3  # several documents share terms with it
    assert index.search(query, limit=2) == everything[:2]
    assert index.search(query, limit=1) == everything[:1]
    assert index.search(query, limit=0) == []


def test_an_empty_corpus_finds_nothing(tok: HFTokenizer) -> None:
    ix = IdIndex(ignore=tok.special_ids)
    assert len(ix) == 0
    assert ix.search(tok.encode("anything at all"), limit=10) == []


def test_a_query_whose_ids_no_document_holds_finds_nothing(
        tok: HFTokenizer, index: IdIndex, docs: dict[str, list[int]]) -> None:
    query = tok.encode("日本語のクエリ")
    assert query and not set(query) & {t for ids in docs.values() for t in ids}
    assert index.search(query, limit=5) == []
    assert index.search([], limit=5) == []


def test_control_ids_are_not_terms(tok: HFTokenizer, docs: dict[str, list[int]]) -> None:
    """Every document framed by BOS/EOS-like control ids: a query of control ids alone
    matches none, and the framing changes no score."""
    controls = sorted(tok.special_ids)[:2]
    framed = IdIndex(ignore=tok.special_ids)
    plain = IdIndex(ignore=tok.special_ids)
    for doc_id, ids in docs.items():
        framed.add(doc_id, [controls[0], *ids, controls[1]])
        plain.add(doc_id, ids)
    assert framed.search(controls, limit=5) == []
    query = tok.encode("feed the cat")
    assert framed.search([controls[0], *query], limit=5) == plain.search(query, limit=5)


def test_added_and_removed_documents_are_seen_by_the_next_search(
        tok: HFTokenizer, index: IdIndex) -> None:
    query = tok.encode("Submarines dive deep under the ocean")
    assert "submarine" not in {d for d, _ in index.search(query, limit=5)}
    index.add("submarine", tok.encode("A submarine can dive deep under the ocean surface."))
    assert index.search(query, limit=5)[0][0] == "submarine"
    index.remove("submarine")
    index.remove("never-added")  # a no-op
    assert "submarine" not in {d for d, _ in index.search(query, limit=5)}
    assert len(index) == len(CORPUS)


def test_searching_converts_nothing(tok: HFTokenizer, docs: dict[str, list[int]]) -> None:
    """Ids in, ids compared: building and querying the index encode and decode nothing."""
    query = tok.encode("feed my cat")
    before = conversions()
    ix = IdIndex(ignore=tok.special_ids)
    for doc_id, ids in docs.items():
        ix.add(doc_id, ids)
    assert ix.search(query, limit=3)[0][0] == "cats"
    assert conversions() == before

"""The `Store` contract, run against both backends (SQLite file, real PostgreSQL server)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.storage.conftest import raw
from tokenwire.errors import DuplicateIdError, InvalidRequestError, InvalidTokenIdError
from tokenwire.storage import (
    Document,
    Store,
    StoredCompletion,
    StoredResponse,
    open_store,
    owner_of,
)

pytestmark = pytest.mark.anyio

SMOLLM2_VOCAB = 49_152
GEMMA3_VOCAB = 262_144
ALICE, BOB = owner_of("sk-alice"), owner_of("sk-bob")


def completion(id: str, *, owner: str = ALICE, model: str = "smollm2",
               metadata: dict[str, str] | None = None, created: int = 1_700_000_000,
               prompt_ids: list[int] | None = None, vocab_size: int = SMOLLM2_VOCAB,
               template_version: str | None = "tpl-1") -> StoredCompletion:
    prompt = prompt_ids if prompt_ids is not None else [1, 9690, 198, vocab_size - 1]
    sampled = [504, 2]
    request: dict[str, Any] = {"model": model, "store": True, "seed": 7, "temperature": 0.5,
                               "messages": [{"role": "user", "content": "héllo ✓"}]}
    response: dict[str, Any] = {"id": id, "object": "chat.completion", "model": model,
                                "choices": [{"index": 0, "token_ids": sampled,
                                             "message": {"role": "assistant", "content": "hi"}}]}
    return StoredCompletion(id=id, owner=owner, model=model, created=created,
                            tokenizer_version="tv-" + model, template_version=template_version,
                            prompt_ids=prompt, vocab_size=vocab_size, request=request,
                            response=response, metadata=metadata or {},
                            output_ids=[sampled, [vocab_size - 1]], spans=[(0, 1, 3)])


async def test_put_then_get_returns_every_field(store: Store) -> None:
    record = completion("chatcmpl-1", metadata={"user": "ü", "run": "3"})
    await store.put_completion(record)
    assert await store.get_completion(ALICE, "chatcmpl-1") == record
    plain = completion("chatcmpl-2", template_version=None, prompt_ids=[])
    await store.put_completion(plain)
    assert await store.get_completion(ALICE, "chatcmpl-2") == plain
    assert await store.get_completion(ALICE, "chatcmpl-missing") is None


async def test_each_choices_stop_and_the_api_that_made_it_round_trip(store: Store) -> None:
    """A choice's stop id (and its logprob) is kept apart from its sampled ids, None where no
    id ended it; a rollout of vLLM's token API says so (read back in every listing too)."""
    import dataclasses

    record = dataclasses.replace(completion("generate-tokens-1"), endpoint="generate",
                                 stops=[(2, -0.125), None])
    await store.put_completion(record)
    assert await store.get_completion(ALICE, "generate-tokens-1") == record
    [listed] = (await store.list_completions(ALICE)).data
    assert listed == record
    updated = await store.update_completion(ALICE, "generate-tokens-1", {"reward": "1"})
    assert updated == dataclasses.replace(record, metadata={"reward": "1"})
    plain = completion("chatcmpl-1")  # a chat completion by default, no stop kept
    await store.put_completion(plain)
    assert (await store.get_completion(ALICE, "chatcmpl-1")).endpoint == "chat.completions"


async def test_one_owner_never_sees_another(store: Store) -> None:
    await store.put_completion(completion("c-1", owner=ALICE))
    await store.put_document(Document("doc-1", ALICE, "tv", [1, 2, 3], 1, SMOLLM2_VOCAB))
    assert await store.get_completion(BOB, "c-1") is None
    assert (await store.list_completions(BOB)).data == []
    assert await store.update_completion(BOB, "c-1", {"x": "y"}) is None
    assert await store.delete_completion(BOB, "c-1") is False
    assert await store.get_document(BOB, "doc-1") is None
    assert await store.documents(BOB) == []
    with pytest.raises(InvalidRequestError) as info:
        await store.list_completions(BOB, after="c-1")  # not even as a cursor
    assert info.value.param == "after"
    # the same id under another owner is another record
    await store.put_completion(completion("c-1", owner=BOB, model="gemma"))
    assert (await store.get_completion(ALICE, "c-1")).model == "smollm2"
    assert (await store.get_completion(BOB, "c-1")).model == "gemma"


async def test_a_second_put_of_one_id_is_refused(store: Store) -> None:
    await store.put_completion(completion("c-1"))
    with pytest.raises(DuplicateIdError, match="already stored"):
        await store.put_completion(completion("c-1", model="other"))
    assert (await store.get_completion(ALICE, "c-1")).model == "smollm2"


async def _ids(store: Store, **kw: Any) -> tuple[list[str], bool]:
    page = await store.list_completions(ALICE, **kw)
    return [r.id for r in page.data], page.has_more


async def test_list_order_limit_and_cursor(store: Store) -> None:
    for i in range(7):
        await store.put_completion(completion(f"c-{i}", created=1_700_000_000 + i // 3))
    await store.put_completion(completion("other", owner=BOB))
    assert await _ids(store) == ([f"c-{i}" for i in range(7)], False)
    assert await _ids(store, order="desc", limit=3) == (["c-6", "c-5", "c-4"], True)
    assert await _ids(store, limit=7) == ([f"c-{i}" for i in range(7)], False)
    # walking pages with `after` visits every record once, in both orders
    for order in ("asc", "desc"):
        seen: list[str] = []
        after = None
        while True:
            ids, more = await _ids(store, order=order, limit=2, after=after)
            seen += ids
            if not more:
                break
            after = ids[-1]
        expected = [f"c-{i}" for i in range(7)]
        assert seen == (expected if order == "asc" else expected[::-1])
    assert await _ids(store, after="c-6") == ([], False)
    assert await _ids(store, after="c-0", order="desc") == ([], False)


async def test_list_filters_by_model_and_every_metadata_pair(store: Store) -> None:
    await store.put_completion(completion("a", model="smollm2", metadata={"team": "x",
                                                                          "run": "1"}))
    await store.put_completion(completion("b", model="gemma", metadata={"team": "x"}))
    await store.put_completion(completion("c", model="smollm2", metadata={"team": "y",
                                                                          "run": "1"}))
    await store.put_completion(completion("d", model="smollm2"))
    assert await _ids(store, model="smollm2") == (["a", "c", "d"], False)
    assert await _ids(store, model="nope") == ([], False)
    assert await _ids(store, metadata={"team": "x"}) == (["a", "b"], False)
    assert await _ids(store, metadata={"team": "x", "run": "1"}) == (["a"], False)
    assert await _ids(store, metadata={"run": "1"}, model="smollm2") == (["a", "c"], False)
    assert await _ids(store, metadata={"team": "x", "run": "2"}) == ([], False)
    assert await _ids(store, metadata={"team": "x"}, limit=1) == (["a"], True)
    assert await _ids(store, metadata={"team": "x"}, limit=1, after="a") == (["b"], False)
    # keys and values that would be syntax in a JSON path or a LIKE pattern are plain text
    await store.put_completion(completion("e", metadata={"a.b": "%", "$[0]": "'"}))
    assert await _ids(store, metadata={"a.b": "%", "$[0]": "'"}) == (["e"], False)
    assert await _ids(store, metadata={"a.b": "x%"}) == ([], False)


async def test_list_refuses_bad_cursor_and_limit(store: Store) -> None:
    await store.put_completion(completion("a"))
    with pytest.raises(InvalidRequestError, match="'nope'") as info:
        await store.list_completions(ALICE, after="nope")
    assert info.value.param == "after"
    with pytest.raises(InvalidRequestError) as info:
        await store.list_completions(ALICE, limit=0)
    assert info.value.param == "limit"


async def test_update_replaces_metadata(store: Store) -> None:
    await store.put_completion(completion("a", metadata={"old": "1", "keep": "no"}))
    updated = await store.update_completion(ALICE, "a", {"new": "2"})
    assert updated is not None and updated.metadata == {"new": "2"}
    assert updated.prompt_ids == completion("a").prompt_ids
    assert (await store.get_completion(ALICE, "a")) == updated
    assert await _ids(store, metadata={"old": "1"}) == ([], False)
    assert await _ids(store, metadata={"new": "2"}) == (["a"], False)
    assert await store.update_completion(ALICE, "missing", {"x": "y"}) is None


async def test_delete(store: Store) -> None:
    await store.put_completion(completion("a"))
    await store.put_completion(completion("b"))
    assert await store.delete_completion(ALICE, "a") is True
    assert await store.get_completion(ALICE, "a") is None
    assert await store.delete_completion(ALICE, "a") is False
    assert await _ids(store) == (["b"], False)
    with pytest.raises(InvalidRequestError):
        await store.list_completions(ALICE, after="a")


@pytest.mark.parametrize(("vocab", "width"), [(SMOLLM2_VOCAB, 2), (GEMMA3_VOCAB, 4)])
async def test_documents_round_trip_packed(store: Store, store_url: str, vocab: int,
                                           width: int) -> None:
    ids = [0, 2, 65_535 % vocab, vocab - 1] * 1000
    doc = Document("doc-1", ALICE, f"tv-{vocab}", ids, 1_700_000_000, vocab)
    await store.put_document(doc)
    await store.put_document(Document("doc-0", ALICE, "tv", [], 1_700_000_001, vocab))
    assert await store.get_document(ALICE, "doc-1") == doc
    assert [d.id for d in await store.documents(ALICE)] == ["doc-1", "doc-0"]
    assert [d.id for d in await store.documents(ALICE, "tv")] == ["doc-0"]  # one version
    assert await store.documents(ALICE, "tv-none") == []
    assert await store.get_document(ALICE, "doc-2") is None
    # as packed on disk: `width` bytes an id, and the count beside them
    [(w, n, count)] = raw(store_url, "SELECT width, length(ids), count FROM documents "
                          "WHERE id = ?", ("doc-1",))
    assert (w, n, count) == (width, width * len(ids), len(ids))


async def test_ids_outside_the_vocabulary_are_not_stored(store: Store) -> None:
    with pytest.raises(InvalidTokenIdError):
        await store.put_document(Document("d", ALICE, "tv", [1, SMOLLM2_VOCAB], 1,
                                          SMOLLM2_VOCAB))
    with pytest.raises(InvalidTokenIdError):
        await store.put_completion(completion("c", prompt_ids=[-1]))
    assert await store.documents(ALICE) == []
    assert (await store.list_completions(ALICE)).data == []


async def test_records_outlive_the_store_object(store_url: str) -> None:
    first = open_store(store_url)
    await first.put_completion(completion("a"))
    await first.put_document(Document("d", ALICE, "tv", [5, 6], 1, GEMMA3_VOCAB))
    await first.aclose()
    again = open_store(store_url)
    try:
        assert await again.get_completion(ALICE, "a") == completion("a")
        assert (await again.get_document(ALICE, "d")).token_ids == [5, 6]
    finally:
        await again.aclose()


def response(id: str, *, owner: str = ALICE, vocab_size: int = SMOLLM2_VOCAB,
             previous_id: str | None = None) -> StoredResponse:
    return StoredResponse(
        id=id, owner=owner, model="smollm2", created=1_700_000_000,
        tokenizer_version="tv-smollm2", template_version="tpl-1", vocab_size=vocab_size,
        prompt_ids=[1, 9690, vocab_size - 1], output_ids=[504, vocab_size - 1],
        messages=[{"role": "user", "content": "héllo ✓"}],
        input_items=[{"id": "msg_1", "type": "message", "role": "user",
                      "content": [{"type": "input_text", "text": "héllo ✓"}]}],
        request={"model": "smollm2", "input": "héllo ✓"},
        response={"id": id, "object": "response", "output": []}, previous_id=previous_id)


@pytest.mark.parametrize("vocab", [SMOLLM2_VOCAB, GEMMA3_VOCAB])
async def test_responses_round_trip(store: Store, vocab: int) -> None:
    first = response("resp_1", vocab_size=vocab)
    await store.put_response(first)
    second = response("resp_2", vocab_size=vocab, previous_id="resp_1")
    await store.put_response(second)
    assert await store.get_response(ALICE, "resp_1") == first
    assert await store.get_response(ALICE, "resp_2") == second
    assert await store.get_response(ALICE, "resp_missing") is None
    with pytest.raises(DuplicateIdError):
        await store.put_response(response("resp_1"))


async def test_responses_are_per_owner(store: Store) -> None:
    await store.put_response(response("resp_1"))
    assert await store.get_response(BOB, "resp_1") is None
    assert await store.delete_response(BOB, "resp_1") is False
    assert await store.delete_response(ALICE, "resp_1") is True
    assert await store.get_response(ALICE, "resp_1") is None
    assert await store.delete_response(ALICE, "resp_1") is False


async def test_response_ids_outside_the_vocabulary_are_not_stored(store: Store) -> None:
    bad = response("resp_1")
    with pytest.raises(InvalidTokenIdError):
        await store.put_response(StoredResponse(**{**bad.__dict__,
                                                   "output_ids": [SMOLLM2_VOCAB]}))
    assert await store.get_response(ALICE, "resp_1") is None


async def test_expire_deletes_completions_and_responses_by_age(store: Store) -> None:
    old, new = 1_700_000_000, 1_700_000_100
    for owner in (ALICE, BOB):
        await store.put_completion(completion("c-old", owner=owner, created=old))
        await store.put_response(StoredResponse(**{**response("r-old", owner=owner).__dict__,
                                                   "created": old}))
    await store.put_completion(completion("c-new", created=new))
    await store.put_response(StoredResponse(**{**response("r-new").__dict__, "created": new}))
    await store.put_document(Document("doc-old", ALICE, "tv", [1, 2], old, SMOLLM2_VOCAB))
    assert await store.expire(new) == 4  # every owner's: retention is the server's
    for owner in (ALICE, BOB):
        assert await store.get_completion(owner, "c-old") is None
        assert await store.get_response(owner, "r-old") is None
    assert await store.get_completion(ALICE, "c-new") is not None
    assert await store.get_response(ALICE, "r-new") is not None
    assert [c.id for c in (await store.list_completions(ALICE)).data] == ["c-new"]
    assert await store.get_document(ALICE, "doc-old") is not None  # a corpus: kept
    assert await store.expire(new) == 0


async def test_expire_goes_a_batch_at_a_time(store: Store,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenwire.storage import _sql

    monkeypatch.setattr(_sql, "EXPIRE_BATCH", 2)
    monkeypatch.setattr(_sql, "EXPIRE", tuple(
        t.replace("LIMIT 1000", "LIMIT 2") for t in _sql.EXPIRE))
    for i in range(5):
        await store.put_completion(completion(f"c-{i}", created=i))
        await store.put_response(StoredResponse(**{**response(f"r-{i}").__dict__,
                                                   "created": i}))
    assert await store.expire(4) == 8  # 2 + 2 (+ 0: a full batch asks again), both tables
    assert [c.id for c in (await store.list_completions(ALICE)).data] == ["c-4"]
    assert await store.get_response(ALICE, "r-4") is not None


async def test_delete_document(store: Store) -> None:
    await store.put_document(Document("doc-1", ALICE, "tv", [1, 2], 1, SMOLLM2_VOCAB))
    await store.put_document(Document("doc-2", ALICE, "tv", [3], 2, SMOLLM2_VOCAB))
    assert await store.delete_document(BOB, "doc-1") is False
    assert await store.delete_document(ALICE, "doc-1") is True
    assert await store.get_document(ALICE, "doc-1") is None
    assert [d.id for d in await store.documents(ALICE)] == ["doc-2"]
    assert await store.delete_document(ALICE, "doc-1") is False

"""Stored completions and documents against the live server (the real model; embedded, or a
gateway in front of a real upstream), through the official `openai` SDK's own calls."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest

from tests.conftest import LiveServer

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"


def test_the_sdk_stored_completions_calls(client: openai.OpenAI) -> None:
    run = uuid.uuid4().hex  # the live server's store is shared by the session's tests
    made = [client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Count to {i}."}], max_tokens=8,
        temperature=0, store=True, metadata={"run": run, "i": str(i)}) for i in range(3)]
    page = client.chat.completions.list(metadata={"run": run}, limit=2)
    assert [c.id for c in page.data] == [m.id for m in made[:2]]
    assert page.has_more
    everything = list(client.chat.completions.list(metadata={"run": run}, limit=2))
    assert [c.id for c in everything] == [m.id for m in made]  # the SDK follows the cursor
    assert [c.id for c in client.chat.completions.list(
        metadata={"run": run, "i": "1"}, model=MODEL)] == [made[1].id]
    got = client.chat.completions.retrieve(made[0].id)
    assert got.choices[0].message.content == made[0].choices[0].message.content
    assert got.usage == made[0].usage
    messages = client.chat.completions.messages.list(made[2].id)
    assert [(m.role, m.content) for m in messages] == [("user", "Count to 2.")]
    updated = client.chat.completions.update(made[1].id, metadata={"run": run, "kept": "yes"})
    assert updated.metadata == {"run": run, "kept": "yes"}
    assert client.chat.completions.retrieve(made[1].id).metadata == updated.metadata
    deleted = client.chat.completions.delete(made[2].id)
    assert (deleted.id, deleted.deleted) == (made[2].id, True)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(made[2].id)
    assert [c.id for c in client.chat.completions.list(metadata={"run": run})] == \
        [m.id for m in made[:2]]


def test_ids_of_a_stored_completion_are_the_sampled_ones(client: openai.OpenAI,
                                                          live_server: LiveServer) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=12,
        temperature=0, store=True,
        extra_body={"return_token_ids": True, "response_format_tokens": "only"})
    sampled = r.choices[0].model_extra["token_ids"]  # type: ignore[index]
    assert r.choices[0].message.content is None
    base = f"{live_server.base_url}/chat/completions/{r.id}"
    tokens = httpx.get(base, params={"format": "tokens"}).json()
    assert tokens["choices"][0]["message"]["token_ids"] == sampled
    assert tokens["prompt_token_ids"] == r.model_extra["prompt_token_ids"]  # type: ignore[index]
    text = httpx.get(base, params={"format": "text"}).json()
    plain = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=12,
        temperature=0)
    assert text["choices"][0]["message"]["content"] == plain.choices[0].message.content


def test_a_document_answers_a_question_from_storage(client: openai.OpenAI,
                                                    live_server: LiveServer) -> None:
    """Store a passage, find it by search, splice it into a chat by reference."""
    base = live_server.base_url
    # the live server's store is shared by the session's tests (schemathesis stores arbitrary
    # documents too): this run's passages carry a tag no other document has, and so does the
    # query
    tag = f"zq{uuid.uuid4().hex[:6]}"
    passages = [f"[{tag}] The capital of France is Paris.", f"[{tag}] Bananas are yellow.",
                f"[{tag}] Rust is a programming language."]
    ids = [httpx.post(f"{base}/documents", json={"text": p}).json()["id"] for p in passages]
    hits = httpx.post(f"{base}/documents/search",
                      json={"query": f"{tag} capital Paris", "limit": 3}).json()
    assert hits["data"][0]["document_id"] == ids[0], (ids, hits)
    # the passage itself (no tag, which would distract a 135M model), spliced by reference
    passage = httpx.post(f"{base}/documents",
                         json={"text": "The capital of France is Paris."}).json()
    held = httpx.get(f"{base}/documents/{passage['id']}").json()["token_ids"]
    r = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=16,
        messages=[{"role": "user", "content": [  # type: ignore[list-item]
            {"type": "input_document", "document_id": passage["id"]},
            {"type": "text", "text": " What is the capital of France?"}]}],
        extra_body={"return_token_ids": True})
    prompt = r.model_extra["prompt_token_ids"]  # type: ignore[index]
    assert any(prompt[i:i + len(held)] == held for i in range(len(prompt)))
    assert "Paris" in (r.choices[0].message.content or "")


def test_a_streamed_choice_is_stored_before_it_is_told_done(client: openai.OpenAI) -> None:
    """The chunk that carries a choice's finish_reason comes after its record is durable: a
    client that stops reading there finds it stored."""
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8,
        temperature=0, store=True, stream=True)
    content = ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            content += chunk.choices[0].delta.content
        if chunk.choices and chunk.choices[0].finish_reason is not None:
            kept = client.chat.completions.retrieve(chunk.id)  # before reading further
            assert kept.choices[0].message.content == content
            break
    else:
        raise AssertionError("no chunk finished the choice")
    stream.close()

"""Stored completions and documents against the live server (the real model; embedded, or a
gateway in front of a real upstream), through the official `openai` SDK's own calls; and a
real `tokenwire serve` killed (SIGKILL) in a burst of `store: true` requests."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import LiveServer
from tests.upstreams import tokenwire_upstream

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=live_server.base_url, api_key="unused", max_retries=0) as c:
        yield c


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
    passages = ["The capital of France is Paris.", "Bananas are yellow fruit.",
                "Rust is a programming language."]
    ids = [httpx.post(f"{base}/documents", json={"text": p}).json()["id"] for p in passages]
    hits = httpx.post(f"{base}/documents/search",
                      json={"query": "What is the capital of France?", "limit": 2}).json()
    assert hits["data"][0]["document_id"] == ids[0]
    r = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=16,
        messages=[{"role": "user", "content": [  # type: ignore[list-item]
            {"type": "input_document", "document_id": ids[0]},
            {"type": "text", "text": " What is the capital of France?"}]}])
    assert "Paris" in (r.choices[0].message.content or "")


@pytest.mark.slow
def test_sigkill_in_a_burst_of_stores_loses_no_acknowledged_record(tmp_path: Path) -> None:
    """Every `store: true` request answered 200 before a SIGKILL is there after the restart,
    whole; the file is consistent."""
    store = tmp_path / "records.sqlite3"
    server = tokenwire_upstream(tmp_path, n_parallel=4, env={"TOKENWIRE_STORAGE": str(store)})
    acked: list[dict[str, Any]] = []

    async def burst() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            async def one(i: int) -> None:
                try:
                    r = await c.post("/v1/chat/completions", json={
                        "model": MODEL, "store": True, "max_tokens": 2, "temperature": 0,
                        "metadata": {"i": str(i)}, "return_token_ids": True,
                        "messages": [{"role": "user", "content": f"Say {i}."}]})
                except httpx.HTTPError:
                    return  # cut off by the kill: never acknowledged
                if r.status_code == 200:
                    acked.append(r.json())

            tasks = [asyncio.create_task(one(i)) for i in range(200)]
            while len(acked) < 20:
                await asyncio.sleep(0.01)
            server.kill()  # mid-burst: requests are in flight
            await asyncio.gather(*tasks)

    try:
        asyncio.run(burst())
        assert server.proc is not None and server.proc.returncode == -9
        assert 20 <= len(acked) < 200
        with sqlite3.connect(store) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        server.start()
        with httpx.Client(base_url=server.url) as c:
            for sent in acked:
                r = c.get(f"/v1/chat/completions/{sent['id']}", params={"format": "tokens"})
                assert r.status_code == 200, sent["id"]
                got = r.json()
                assert got["prompt_token_ids"] == sent["prompt_token_ids"]
                assert got["choices"][0]["message"]["token_ids"] == \
                    sent["choices"][0]["token_ids"]
    finally:
        server.stop()

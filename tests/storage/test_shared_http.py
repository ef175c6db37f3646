"""Two gateways sharing one store (a SQLite file, or a real PostgreSQL database: the deployment
PostgreSQL is for): what one keeps, the other reads, lists, changes and searches, per key."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import serve_in_process
from tests.fakes import MODEL
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ALICE = {"Authorization": "Bearer alice"}
BOB = {"Authorization": "Bearer bob"}


async def test_two_gateways_share_records_and_documents(make_app: Any, store_url: str,
                                                        tok: HFTokenizer) -> None:
    a_app = make_app(api_keys=["alice", "bob"], storage=store_url)
    b_app = make_app(api_keys=["alice", "bob"], storage=store_url)
    async with serve_in_process(a_app) as a, serve_in_process(b_app) as b:
        r = await a.post("/v1/chat/completions", headers=ALICE, json={
            "model": MODEL, "store": True, "metadata": {"via": "a"},
            "messages": [{"role": "user", "content": "Hello!"}]})
        sent = r.json()
        got = (await b.get(f"/v1/chat/completions/{sent['id']}", headers=ALICE)).json()
        assert got["choices"] == sent["choices"] and got["metadata"] == {"via": "a"}
        listed = (await b.get("/v1/chat/completions", headers=ALICE,
                              params={"metadata[via]": "a"})).json()
        assert [c["id"] for c in listed["data"]] == [sent["id"]]
        await b.post(f"/v1/chat/completions/{sent['id']}", headers=ALICE,
                     json={"metadata": {"via": "b"}})
        assert (await a.get(f"/v1/chat/completions/{sent['id']}", headers=ALICE)).json()[
            "metadata"] == {"via": "b"}
        assert (await b.get(f"/v1/chat/completions/{sent['id']}", headers=BOB)).status_code \
            == 404
        # a document stored through one gateway is found and spliced through the other
        ids = tok.encode(" the Loire is the longest river in France")
        doc = (await a.post("/v1/documents", headers=ALICE, json={
            "token_ids": ids, "tokenizer_version": tok.version})).json()
        hits = (await b.post("/v1/documents/search", headers=ALICE, json={
            "query": {"token_ids": tok.encode(" longest river"),
                      "tokenizer_version": tok.version}})).json()
        assert [h["document_id"] for h in hits["data"]] == [doc["id"]]
        assert (await b.post("/v1/documents/search", headers=BOB, json={
            "query": {"token_ids": tok.encode(" longest river"),
                      "tokenizer_version": tok.version}})).json()["data"] == []
        r = await b.post("/v1/chat/completions", headers=ALICE, json={
            "model": MODEL, "return_token_ids": True,
            "messages": [{"role": "user", "content": [
                {"type": "input_document", "document_id": doc["id"]}]}]})
        prompt = r.json()["prompt_token_ids"]
        assert any(prompt[i:i + len(ids)] == ids for i in range(len(prompt)))

"""Version ids over HTTP: an id an earlier release issued (the hash of its artifact's bytes,
the family a folder's or file's name) is still accepted, and answered with the current one."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.conftest import serve_in_process
from tests.fakes import MODEL
from tests.tokenizers.spellings import DIGITS_THEN_BYTE_LEVEL, respell
from tokenwire.storage import open_store
from tokenwire.storage.base import Document
from tokenwire.tokenizers.hf import HFTokenizer, canonical_json
from tokenwire.tokenizers.registry import TokenizerRegistry

pytestmark = pytest.mark.anyio

#: SmolLM2's version from the GGUF before the fingerprint
OLD = "smollm2-49k@sha256:1396d3e34dbb484a"
#: the same artifact's version when it came from a Hugging Face directory of that name
OLD_FROM_A_FOLDER = "smollm2-135m-instruct-49k@sha256:1396d3e34dbb484a"


async def test_requests_pinning_an_old_id_are_accepted(client: httpx.AsyncClient,
                                                       tok: HFTokenizer) -> None:
    ids = tok.encode("Hello!")
    for old in (OLD, OLD_FROM_A_FOLDER):
        r = await client.post("/v1/chat/completions", json={
            "model": MODEL, "tokenizer_version": old, "return_token_ids": True,
            "messages": [{"role": "user", "content": {"type": "input_tokens",
                                                      "token_ids": ids}}]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["tokenizer_version"] == tok.version  # the full, current id
        assert body["token_ids_source"] == "sampled"  # no translation: the model's version
        r = await client.post("/v1/completions", json={
            "model": MODEL, "prompt": ids, "tokenizer_version": old, "max_tokens": 2})
        assert r.status_code == 200, r.text
        r = await client.post("/v1/detokenize", json={"tokenizer_version": old, "tokens": ids})
        assert r.json() == {"prompt": "Hello!", "tokenizer_version": tok.version}


async def test_an_old_id_names_the_published_version(client: httpx.AsyncClient,
                                                     tok: HFTokenizer) -> None:
    entry = (await client.get(f"/v1/tokenizers/{OLD}")).json()
    assert entry["id"] == tok.version and entry["sha256"] == tok.sha256
    r = await client.get(f"/v1/tokenizers/{OLD_FROM_A_FOLDER}/tokenizer.json")
    assert r.content == tok.artifact
    assert r.headers["x-tokenwire-tokenizer-version"] == tok.version
    assert r.headers["x-tokenwire-sha256"] == tok.sha256
    r = await client.post("/v1/detokenize", json={
        "tokenizer_version": "smollm2-49k@sha256:1396d3e34dbb484b", "tokens": [1]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_tokenizer_version"


async def test_another_artifact_of_the_version_is_one_entry(make_app,  # type: ignore[no-untyped-def]
                                                            registry: TokenizerRegistry,
                                                            tok: HFTokenizer) -> None:
    """A Hugging Face directory of the same tokenizer, other bytes: one version, listed once,
    its old id accepted; the bytes published stay the first registered."""
    other = HFTokenizer(canonical_json(respell(json.loads(tok.artifact), DIGITS_THEN_BYTE_LEVEL)))
    app = make_app()
    registry.register(other, aliases=["my-copy"])
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=transport, base_url="http://test") as c:
        listed = (await c.get("/v1/tokenizers")).json()["data"]
        assert [t["id"] for t in listed] == [tok.version]
        assert listed[0]["aliases"] == ["my-copy", "smollm2-49k"]
        old = f"my-copy-49k@sha256:{other.sha256[:16]}"
        r = await c.post("/v1/detokenize", json={"tokenizer_version": old, "tokens": [1, 2]})
        assert r.json()["tokenizer_version"] == tok.version
        r = await c.get(f"/v1/tokenizers/{tok.version}/tokenizer.json")
        assert r.content == tok.artifact


async def test_documents_stored_under_an_old_id_are_the_versions(make_app,  # type: ignore[no-untyped-def]
                                                                 tok: HFTokenizer,
                                                                 tmp_path: Path) -> None:
    """A document an earlier release stored (its version then an artifact's hash) reads back,
    is found by a search in the version, and is spliced into its prompts untranslated."""
    ids = tok.encode(" the river Loire flows through Orléans")
    store = open_store(str(tmp_path / "store.sqlite3"))  # where make_app's settings keep it
    await store.put_document(Document(id="doc-old", owner="", tokenizer_version=OLD, created=1,
                                      token_ids=ids, vocab_size=tok.vocab_size))
    await store.aclose()
    async with serve_in_process(make_app()) as c:
        got = (await c.get("/v1/documents/doc-old", params={"format": "text"})).json()
        assert got["text"] == tok.decode(ids)
        made = (await c.post("/v1/documents", json={"text": "nothing about rivers"})).json()
        assert made["tokenizer_version"] == tok.version
        hits = (await c.post("/v1/documents/search", json={"query": "Loire river"})).json()
        assert hits["tokenizer_version"] == tok.version
        assert hits["data"][0]["document_id"] == "doc-old"
        r = await c.post("/v1/chat/completions", json={
            "model": MODEL, "return_token_ids": True, "messages": [{"role": "user", "content": [
                {"type": "input_document", "document_id": "doc-old"}]}]})
        assert r.status_code == 200, r.text
        assert not [w for w in r.json().get("warnings") or []
                    if w["code"] == "document_translated"]
        prompt = r.json()["prompt_token_ids"]
        assert any(prompt[i:i + len(ids)] == ids for i in range(len(prompt)))

"""The token inspector's server side over HTTP, in process (the scripted engine with the real
tokenizer and template): the page and its assets, detokenize's pieces, and the reads of stored
records the page draws. tests/browser drives the page itself in chromium."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import serve_in_process
from tests.fakes import MODEL, FakeEngine
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = pytest.mark.anyio

STATIC = Path(__file__).parents[2] / "src" / "tokenwire" / "api" / "static" / "inspector"


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    return err


async def test_the_page_and_its_assets_load_nothing_from_elsewhere(
        client: httpx.AsyncClient) -> None:
    page = await client.get("/inspect")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    linked = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert linked == ["inspect/assets/inspect.css", "inspect/assets/inspect.js"]
    for path in linked:
        r = await client.get(f"/{path}")
        assert r.status_code == 200 and r.content == (STATIC / path.rsplit("/", 1)[1]).read_bytes()
    for name in ("inspect.html", "inspect.js", "inspect.css"):
        text = (STATIC / name).read_text()
        assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text), name  # no CDN
    assert error_of(await client.get("/inspect/assets/secret.py"), 404)["type"]


async def test_detokenize_pieces_are_each_ids_own_bytes(client: httpx.AsyncClient,
                                                        tok: HFTokenizer) -> None:
    ids = [1, *tok.encode("café 🎉\n"), 2]
    r = await client.post("/v1/detokenize", json={"tokenizer_version": tok.version,
                                                   "tokens": ids, "return_pieces": True})
    assert r.status_code == 200, r.text
    pieces = r.json()["pieces"]
    assert len(pieces) == len(ids)
    assert pieces[0] == {"text": "<|im_start|>", "control": True}
    assert pieces[-1] == {"text": "<|im_end|>", "control": True}
    raw = b"".join(p["text"].encode() if p["text"] is not None else bytes(p["bytes"])
                   for p in pieces[1:-1])
    assert raw == "café 🎉\n".encode()
    split = [p for p in pieces if p["text"] is None]  # the emoji's bytes over several ids
    assert split and all(p["bytes"] and not p["control"] for p in split)
    plain = await client.post("/v1/detokenize", json={"tokenizer_version": tok.version,
                                                       "tokens": ids})
    assert "pieces" not in plain.json()


async def test_a_stored_completion_as_the_inspector_draws_it(client: httpx.AsyncClient,
                                                            tok: HFTokenizer,
                                                            fake_engine: FakeEngine) -> None:
    first = (await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
        "response_format_tokens": True, "max_tokens": 4})).json()
    said = first["choices"][0]["message"]
    messages = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": said["content"], "token_ids": said["token_ids"]},
                {"role": "user", "content": "Again"}]
    done = (await client.post("/v1/chat/completions", json={
        "model": MODEL, "tokenizer_version": tok.version, "store": True, "logprobs": True,
        "return_token_ids": True, "response_format_tokens": True, "max_tokens": 5,
        "messages": messages})).json()
    r = await client.get(f"/v1/inspect/completions/{done['id']}")
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["object"] == "inspection" and got["kind"] == "chat.completion"
    prompt = got["prompt"]
    assert prompt["token_ids"] == done["prompt_token_ids"]
    assert [p["text"] for p in prompt["pieces"]] == [
        tok.token_bytes(t).decode() for t in prompt["token_ids"]]
    assert [(s["message_index"], s["role"]) for s in prompt["spans"]] == [
        (0, "system"), (1, "user"), (2, "assistant"), (3, "user")]
    a = prompt["spans"][2]
    assert prompt["token_ids"][a["start"]:a["end"]] == said["token_ids"]
    assert [i for i, m in enumerate(prompt["sampled_mask"]) if m] == list(
        range(a["start"], a["end"]))
    # the same mask the render gives for the same messages
    render = (await client.post("/v1/chat/completions/render", json={
        "model": MODEL, "tokenizer_version": tok.version, "messages": messages})).json()
    assert render["token_ids"] == prompt["token_ids"] and render["spans"] == prompt["spans"]
    assert render["sampled_mask"] == prompt["sampled_mask"]
    (sample,) = got["samples"]
    choice = done["choices"][0]
    assert sample["token_ids"] == choice["message"]["token_ids"]
    assert sample["logprobs"] == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert sample["finish_reason"] == choice["finish_reason"]


async def test_a_stored_response_and_its_continuation(client: httpx.AsyncClient) -> None:
    first = (await client.post("/v1/responses", json={
        "model": MODEL, "instructions": "Be kind.", "input": "Hi", "max_output_tokens": 4,
        "include": ["input.token_ids", "output.token_ids"]})).json()
    r = (await client.get(f"/v1/inspect/responses/{first['id']}")).json()
    assert r["kind"] == "response" and "note" not in r
    assert r["prompt"]["token_ids"] == first["input_token_ids"]
    assert [s["role"] for s in r["prompt"]["spans"]] == ["system", "user"]
    assert set(r["prompt"]["sampled_mask"]) == {0}
    out = [i for item in first["output"] for i in item.get("token_ids", [])]
    assert r["samples"][0]["token_ids"] == out and "logprobs" not in r["samples"][0]
    second = (await client.post("/v1/responses", json={
        "model": MODEL, "input": "Again", "previous_response_id": first["id"],
        "max_output_tokens": 4, "include": ["input.token_ids"]})).json()
    r2 = (await client.get(f"/v1/inspect/responses/{second['id']}")).json()
    assert "previous_response_id" in r2["note"] and "spans" not in r2["prompt"]
    n = len(first["input_token_ids"])
    mask = r2["prompt"]["sampled_mask"]
    assert r2["prompt"]["token_ids"] == second["input_token_ids"]
    assert [i for i, m in enumerate(mask) if m] == list(range(n, n + len(out)))


async def test_errors_name_what_is_wrong(client: httpx.AsyncClient, make_app: Any) -> None:
    err = error_of(await client.get("/v1/inspect/completions/chatcmpl-nope"), 404)
    assert err["code"] == "completion_not_found"
    err = error_of(await client.get("/v1/inspect/responses/resp_nope"), 404)
    assert err["type"] == "invalid_request_error"
    err = error_of(await client.get("/v1/inspect/completions/x?format=text"), 400)
    assert err["param"] == "format"
    async with serve_in_process(make_app(storage="none")) as bare:
        err = error_of(await bare.get("/v1/inspect/completions/x"), 400)
        assert err["param"] == "store"
        err = error_of(await bare.get("/v1/inspect/responses/x"), 400)
        assert err["param"] == "store"

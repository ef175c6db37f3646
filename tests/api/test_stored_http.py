"""Stored chat completions (`store: true`) and documents over HTTP, in process: the scripted
engine with the real tokenizer and template, and a real SQLite file per test."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import serve_in_process
from tests.fakes import MODEL, FakeEngine
from tokenwire.tokenizers.conversions import conversions
from tokenwire.tokenizers.hf import HFTokenizer
from tokenwire.tokenizers.registry import TokenizerRegistry

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"


def body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], **kw}


async def stored(client: httpx.AsyncClient, **kw: Any) -> dict[str, Any]:
    r = await client.post(CHAT, json=body(store=True, **kw))
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def sse(client: httpx.AsyncClient, payload: dict[str, Any]) -> list[dict[str, Any]]:
    r = await client.post(CHAT, json={**payload, "stream": True})
    assert r.status_code == 200, r.text
    frames = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    return err


async def test_a_stored_completion_reads_back_as_it_went_out(client: httpx.AsyncClient) -> None:
    sent = await stored(client, metadata={"run": "7"})
    r = await client.get(f"{CHAT}/{sent['id']}")
    assert r.status_code == 200
    got = r.json()
    assert got.pop("metadata") == {"run": "7"}
    assert got == sent


async def test_formats_give_ids_text_or_both(client: httpx.AsyncClient, tok: HFTokenizer,
                                             fake_engine: FakeEngine) -> None:
    # stored as ids alone: no text was made when it ran
    sent = await stored(client, response_format_tokens="only", return_token_ids=True)
    assert sent["choices"][0]["message"]["content"] is None
    ids = sent["choices"][0]["message"]["token_ids"]
    assert ids == fake_engine.script
    base = f"{CHAT}/{sent['id']}"
    tokens = (await client.get(base, params={"format": "tokens"})).json()
    message = tokens["choices"][0]["message"]
    assert (message["content"], message["token_ids"]) == (None, ids)
    assert tokens["prompt_token_ids"] == sent["prompt_token_ids"]
    assert tokens["tokenizer_version"] == tok.version
    text = (await client.get(base, params={"format": "text"})).json()
    assert text["choices"][0]["message"]["content"] == tok.decode(ids)
    assert "token_ids" not in text["choices"][0]["message"]
    assert "prompt_token_ids" not in text and "tokenizer_version" not in text
    both = (await client.get(base, params={"format": "both"})).json()["choices"][0]["message"]
    assert (both["content"], both["token_ids"]) == (tok.decode(ids), ids)


async def test_ids_are_kept_even_when_the_response_showed_only_text(
        client: httpx.AsyncClient, fake_engine: FakeEngine) -> None:
    sent = await stored(client)
    assert "token_ids" not in sent["choices"][0]["message"]
    got = (await client.get(f"{CHAT}/{sent['id']}", params={"format": "both"})).json()
    assert got["choices"][0]["message"]["token_ids"] == fake_engine.script
    assert got["choices"][0]["message"]["content"] == sent["choices"][0]["message"]["content"]


async def test_a_stream_is_stored_as_the_same_request_unstreamed(
        client: httpx.AsyncClient) -> None:
    whole = await stored(client, seed=1)
    chunks = await sse(client, body(store=True, seed=1))
    got = (await client.get(f"{CHAT}/{chunks[0]['id']}")).json()
    assert got["choices"] == whole["choices"]
    assert got["usage"] == whole["usage"]


async def test_list_filters_pages_and_orders(client: httpx.AsyncClient) -> None:
    ids = [(await stored(client, metadata={"k": "a" if i % 2 else "b"}))["id"]
           for i in range(5)]
    page = (await client.get(CHAT, params={"limit": 2})).json()
    assert page["object"] == "list"
    assert [c["id"] for c in page["data"]] == ids[:2]
    assert (page["first_id"], page["last_id"], page["has_more"]) == (ids[0], ids[1], True)
    rest = (await client.get(CHAT, params={"after": ids[1], "limit": 10})).json()
    assert [c["id"] for c in rest["data"]] == ids[2:] and rest["has_more"] is False
    desc = (await client.get(CHAT, params={"order": "desc"})).json()
    assert [c["id"] for c in desc["data"]] == ids[::-1]
    only_a = (await client.get(CHAT, params={"metadata[k]": "a"})).json()
    assert [c["id"] for c in only_a["data"]] == [ids[1], ids[3]]
    assert (await client.get(CHAT, params={"model": "other"})).json()["data"] == []


async def test_update_replaces_metadata_and_delete_removes(client: httpx.AsyncClient) -> None:
    cid = (await stored(client, metadata={"a": "1"}))["id"]
    r = await client.post(f"{CHAT}/{cid}", json={"metadata": {"b": "2"}})
    assert r.status_code == 200 and r.json()["metadata"] == {"b": "2"}
    assert (await client.get(f"{CHAT}/{cid}")).json()["metadata"] == {"b": "2"}
    r = await client.delete(f"{CHAT}/{cid}")
    assert r.json() == {"id": cid, "object": "chat.completion.deleted", "deleted": True}
    err = error_of(await client.get(f"{CHAT}/{cid}"), 404)
    assert err["code"] == "completion_not_found"
    assert error_of(await client.delete(f"{CHAT}/{cid}"), 404)["code"] == "completion_not_found"


async def test_messages_come_back_as_text_or_as_the_ids_the_model_read(
        client: httpx.AsyncClient, tok: HFTokenizer) -> None:
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Say "},
                                         {"type": "input_tokens",
                                          "token_ids": tok.encode(" hi")}]}]
    cid = (await stored(client, messages=msgs, tokenizer_version=tok.version))["id"]
    text = (await client.get(f"{CHAT}/{cid}/messages")).json()
    assert [(m["id"], m["role"], m["content"]) for m in text["data"]] == [
        (f"{cid}-0", "system", "Be brief."), (f"{cid}-1", "user", "Say  hi")]
    tokens = (await client.get(f"{CHAT}/{cid}/messages", params={"format": "tokens"})).json()
    assert tokens["data"][0]["token_ids"] == tok.encode("Be brief.")
    assert tokens["data"][1]["token_ids"] == tok.encode("Say ") + tok.encode(" hi")
    assert all(m["content"] is None for m in tokens["data"])
    page = (await client.get(f"{CHAT}/{cid}/messages",
                             params={"limit": 1, "order": "desc"})).json()
    assert [m["id"] for m in page["data"]] == [f"{cid}-1"] and page["has_more"] is True
    rest = (await client.get(f"{CHAT}/{cid}/messages",
                             params={"after": f"{cid}-1", "order": "desc"})).json()
    assert [m["id"] for m in rest["data"]] == [f"{cid}-0"] and rest["has_more"] is False


async def test_messages_keep_what_was_sent_whatever_the_template_did(
        client: httpx.AsyncClient) -> None:
    """Text comes from the request, not from the prompt: a truncated prompt, tool calls and
    their results read back as sent."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}
    msgs = [{"role": "user", "content": "Add 1 and 2, please, and explain at length."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    cid = (await stored(client, messages=msgs, truncate_prompt_tokens=12, max_tokens=4))["id"]
    got = (await client.get(f"{CHAT}/{cid}/messages")).json()["data"]
    assert [m["content"] for m in got] == [msgs[0]["content"], None, "3"]
    assert got[1]["tool_calls"] == [call] and got[2]["tool_call_id"] == "call_1"
    err = error_of(await client.get(f"{CHAT}/{cid}/messages", params={"format": "tokens"}), 400)
    assert err["param"] == "format"  # a truncated prompt no longer holds every message


async def test_each_api_key_sees_only_its_own_records(make_app: Any) -> None:
    async with serve_in_process(make_app(api_keys=["alice", "bob"])) as c:
        alice = {"Authorization": "Bearer alice"}
        bob = {"Authorization": "Bearer bob"}
        r = await c.post(CHAT, json=body(store=True), headers=alice)
        cid = r.json()["id"]
        assert (await c.get(f"{CHAT}/{cid}", headers=alice)).status_code == 200
        assert error_of(await c.get(f"{CHAT}/{cid}", headers=bob), 404)["code"] == \
            "completion_not_found"
        assert (await c.get(CHAT, headers=bob)).json()["data"] == []
        assert (await c.delete(f"{CHAT}/{cid}", headers=bob)).status_code == 404
        doc = (await c.post("/v1/documents", json={"text": "x"}, headers=alice)).json()
        assert (await c.get(f"/v1/documents/{doc['id']}", headers=bob)).status_code == 404
        assert (await c.delete(f"/v1/documents/{doc['id']}", headers=bob)).status_code == 404
        assert (await c.get(f"/v1/documents/{doc['id']}", headers=alice)).status_code == 200


async def test_bad_reads_are_refused_by_name(client: httpx.AsyncClient) -> None:
    cid = (await stored(client))["id"]
    for params, param in (({"format": "xml"}, "format"), ({"limit": "0"}, "limit"),
                          ({"limit": "x"}, "limit"), ({"limit": "\u00b2"}, "limit"),
                          ({"order": "up"}, "order"), ({"after": "a\x00"}, "after"),
                          ({"colour": "red"}, "colour"), ({"after": "nope"}, "after")):
        assert error_of(await client.get(CHAT, params=params), 400)["param"] == param
    assert error_of(await client.get(f"{CHAT}/{cid}", params={"format": "x"}), 400)["param"] \
        == "format"
    assert error_of(await client.get(f"{CHAT}/a%00b"), 400)["param"] == "completion_id"
    assert error_of(await client.get(f"{CHAT}/{cid}/messages", params={"limit": "\u00b2"}),
                    400)["param"] == "limit"
    r = await client.post(f"{CHAT}/{cid}", json={"metadata": {"k" * 65: "v"}})
    assert error_of(r, 400)["param"].startswith("metadata")
    r = await client.post(f"{CHAT}/{cid}", json={"metadata": {"k": "v"}, "model": "x"})
    assert error_of(r, 400)["param"] == "model"


async def test_store_and_metadata_are_checked(client: httpx.AsyncClient,
                                              fake_engine: FakeEngine) -> None:
    r = await client.post(CHAT, json=body(store=True, metadata={str(i): "v" for i in range(17)}))
    assert error_of(r, 400)["param"] == "metadata"
    r = await client.post(CHAT, json=body(store=True, metadata={"k": "a\x00b"}))
    assert error_of(r, 400)["param"].startswith("metadata")
    first = await stored(client, request_id="fixed")
    assert first["id"] == "chatcmpl-fixed"
    runs = len(fake_engine.prompts)
    r = await client.post(CHAT, json=body(store=True, request_id="fixed"))
    err = error_of(r, 400)
    assert (err["code"], err["param"]) == ("duplicate_id", "request_id")
    assert len(fake_engine.prompts) == runs  # refused before anything was generated
    r = await client.post(CHAT, json=body(store=True, request_id="a\x00b"))
    assert error_of(r, 400)["param"] == "request_id"


async def test_without_storage_store_is_refused_by_name(make_app: Any) -> None:
    async with serve_in_process(make_app(storage="none")) as c:
        assert error_of(await c.post(CHAT, json=body(store=True)), 400)["param"] == "store"
        assert (await c.post(CHAT, json=body(store=False))).status_code == 200
        assert error_of(await c.get(CHAT), 400)["param"] == "store"
        r = await c.post("/v1/documents", json={"text": "x"})
        assert error_of(r, 400)["param"] == "documents"


# -- documents --------------------------------------------------------------------------------


async def test_a_document_sent_as_text_or_ids_reads_back_both_ways(
        client: httpx.AsyncClient, tok: HFTokenizer) -> None:
    text = "Les token ids ne changent pas. 🎉"
    r = await client.post("/v1/documents", json={"text": text})
    assert r.status_code == 200
    made = r.json()
    assert (made["tokenizer_version"], made["count"]) == (tok.version, len(tok.encode(text)))
    got = (await client.get(f"/v1/documents/{made['id']}")).json()
    assert got == {"id": made["id"], "object": "document", "token_ids": tok.encode(text),
                   "tokenizer_version": tok.version}
    as_text = (await client.get(f"/v1/documents/{made['id']}", params={"format": "text"}))
    assert as_text.json() == {"id": made["id"], "object": "document", "text": text}
    ids = [1000, 2000, 49151]  # any ids, canonical or not, as they are
    made = (await client.post("/v1/documents", json={"token_ids": ids,
                                                     "tokenizer_version": "smollm2-49k"})).json()
    assert made["tokenizer_version"] == tok.version and made["count"] == 3
    assert (await client.get(f"/v1/documents/{made['id']}")).json()["token_ids"] == ids


async def test_bad_documents_are_refused_by_name(client: httpx.AsyncClient,
                                                 tok: HFTokenizer) -> None:
    for payload, param in (
            ({"token_ids": [1, 2]}, "tokenizer_version"),
            ({"token_ids": [500, 10**6], "tokenizer_version": tok.version}, "token_ids[1]"),
            ({"token_ids": [500, min(tok.special_ids)], "tokenizer_version": tok.version},
             "token_ids[1]"),
            ({"text": "x", "tokenizer_version": "nope@sha256:0000000000000000"},
             "tokenizer_version"),
    ):
        err = error_of(await client.post("/v1/documents", json=payload), 400)
        assert err["param"] == param, (payload, err)
    err = error_of(await client.post("/v1/documents", json={"text": "a", "token_ids": [1]}), 400)
    assert "exactly one" in err["message"]
    err = error_of(await client.get("/v1/documents/doc-missing"), 404)
    assert err["code"] == "document_not_found"


async def test_a_deleted_document_is_gone_from_reads_searches_and_prompts(
        client: httpx.AsyncClient) -> None:
    made = [(await client.post("/v1/documents", json={"text": t})).json()["id"]
            for t in ("Paris is the capital of France.", "Bread is baked in an oven.")]

    async def found(query: str) -> list[str]:
        r = await client.post("/v1/documents/search", json={"query": query, "limit": 5})
        return [h["document_id"] for h in r.json()["data"]]

    assert set(await found("capital of France bread oven")) == set(made)
    r = await client.delete(f"/v1/documents/{made[0]}")
    assert r.status_code == 200
    assert r.json() == {"id": made[0], "object": "document", "deleted": True}
    assert error_of(await client.get(f"/v1/documents/{made[0]}"), 404)["code"] == \
        "document_not_found"
    assert await found("capital of France bread oven") == [made[1]]  # the index is rebuilt
    err = error_of(await client.post(CHAT, json=body(messages=[{"role": "user", "content": [
        {"type": "input_document", "document_id": made[0]}]}])), 404)
    assert (err["code"], err["param"]) == ("document_not_found",
                                           "messages[0].content[0].document_id")
    assert error_of(await client.delete(f"/v1/documents/{made[0]}"), 404)["code"] == \
        "document_not_found"
    assert error_of(await client.delete(f"/v1/documents/{made[1]}?x=1"), 400)["param"] == "x"


async def test_input_document_splices_the_stored_ids_into_the_prompt(
        client: httpx.AsyncClient, tok: HFTokenizer) -> None:
    ids = tok.encode(" a stored passage")
    doc = (await client.post("/v1/documents", json={"token_ids": ids,
                                                    "tokenizer_version": tok.version})).json()
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Read:"},
                                         {"type": "input_document", "document_id": doc["id"]}]}]
    r = await client.post(CHAT, json=body(messages=msgs, return_token_ids=True))
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt_token_ids"]
    want = tok.encode("Read:") + ids
    assert any(prompt[i:i + len(want)] == want for i in range(len(prompt)))
    # the same through render, with the document's span where the message went
    r = await client.post(f"{CHAT}/render", json=body(messages=msgs))
    span = r.json()["spans"][0]
    assert r.json()["token_ids"][span["start"]:span["end"]] == want
    err = error_of(await client.post(CHAT, json=body(messages=[
        {"role": "user", "content": [{"type": "input_document", "document_id": "doc-x"}]}])),
        404)
    assert (err["code"], err["param"]) == ("document_not_found",
                                           "messages[0].content[0].document_id")
    err = error_of(await client.post("/v1/tokenize", json={"model": MODEL, "messages": msgs}),
                   400)
    assert err["param"] == "messages[0].content[1]"
    many = [{"type": "input_document", "document_id": doc["id"]}] * 65
    err = error_of(await client.post(CHAT, json=body(messages=[
        {"role": "user", "content": many}])), 400)
    assert err["param"] == "messages"
    # one document many times is read once and spliced at each place
    r = await client.post(CHAT, json=body(return_token_ids=True, messages=[
        {"role": "user", "content": many[:3]}]))
    prompt = r.json()["prompt_token_ids"]
    assert any(prompt[i:i + 3 * len(ids)] == ids * 3 for i in range(len(prompt)))


async def test_a_document_of_another_version_is_translated_and_says_so(
        make_app: Any, registry: TokenizerRegistry, tok: HFTokenizer,
        gemma_tok: HFTokenizer) -> None:
    """A document kept in Gemma 3's ids, used with SmolLM2: translated (the only conversion
    in between), with a warning naming the block; the prompt holds the same text's ids."""
    registry.register(gemma_tok, aliases=[gemma_tok.family])
    passage = "The river Loire is the longest river in France."
    async with serve_in_process(make_app()) as c:
        doc = (await c.post("/v1/documents", json={
            "token_ids": gemma_tok.encode(passage),
            "tokenizer_version": gemma_tok.version})).json()
        assert doc["tokenizer_version"] == gemma_tok.version
        before = conversions()
        r = await c.post(CHAT, json=body(
            return_token_ids=True, response_format_tokens="only", tokenizer_version=tok.version,
            messages=[{"role": "user", "content": [
                {"type": "input_document", "document_id": doc["id"]}]}]))
        moved = {k: v - before.get(k, 0) for k, v in conversions().items()
                 if v != before.get(k, 0)}
    assert r.status_code == 200, r.text
    [warning] = [w for w in r.json()["warnings"] if w["code"] == "document_translated"]
    assert warning["param"] == "messages[0].content[0]"
    want = tok.encode(passage)
    prompt = r.json()["prompt_token_ids"]
    assert any(prompt[i:i + len(want)] == want for i in range(len(prompt)))
    assert {reason for _, reason in moved} <= {"translate", "template"}, moved
    assert moved[("decode", "translate")] >= 1

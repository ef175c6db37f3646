"""Stored responses (`store`, OpenAI's default) and `previous_response_id` over HTTP, in
process: the scripted engine with the real tokenizer and template, and a real SQLite file per
test (the real model and the official SDK: tests/e2e/test_stored_responses_openai.py)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from tests.api.test_responses_http import error, typed_events
from tests.api.test_tools_http import OUTPUT, WEATHER
from tests.conftest import serve_in_process
from tests.fakes import MODEL, FakeEngine, other_tokenizer
from tokenwire.errors import InvalidTokenIdError, StorageError
from tokenwire.storage import StoredResponse
from tokenwire.tokenizers.hf import HFTokenizer
from tokenwire.tokenizers.registry import TokenizerRegistry
from tokenwire.tokenizers.translate import translator

pytestmark = pytest.mark.anyio

IDS = ["input.token_ids", "output.token_ids"]
TOOL = {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]
RESPONSES = "/v1/responses"


async def create(client: httpx.AsyncClient, **kw: Any) -> dict[str, Any]:
    r = await client.post(RESPONSES, json={"model": MODEL, **kw})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def test_a_response_is_stored_by_default_and_reads_back_as_it_went_out(
        client: httpx.AsyncClient) -> None:
    sent = await create(client, input="Hello!", metadata={"run": "1"})
    assert sent["store"] is True and sent["previous_response_id"] is None
    got = await client.get(f"{RESPONSES}/{sent['id']}")
    assert got.status_code == 200 and got.json() == sent
    deleted = await client.delete(f"{RESPONSES}/{sent['id']}")
    assert deleted.json() == {"id": sent["id"], "object": "response", "deleted": True}
    assert error(await client.get(f"{RESPONSES}/{sent['id']}"), 404) == \
        ("response_not_found", None)
    assert error(await client.delete(f"{RESPONSES}/{sent['id']}"), 404) == \
        ("response_not_found", None)


async def test_store_false_keeps_nothing(client: httpx.AsyncClient) -> None:
    sent = await create(client, input="Hello!", store=False)
    assert sent["store"] is False
    assert error(await client.get(f"{RESPONSES}/{sent['id']}"), 404)[0] == "response_not_found"
    r = await client.post(RESPONSES, json={"model": MODEL, "input": "and?",
                                           "previous_response_id": sent["id"]})
    assert error(r, 404) == ("previous_response_not_found", "previous_response_id")


async def test_include_on_a_read(client: httpx.AsyncClient, fake_engine: FakeEngine) -> None:
    sent = await create(client, input="Hello!")
    url = f"{RESPONSES}/{sent['id']}"
    r = await client.get(url, params={"include[]": "input.token_ids"})
    assert r.json()["input_token_ids"] == fake_engine.prompts[-1]
    r = await client.get(url, params=[("include[]", "input.token_ids"),
                                      ("include[]", "output.token_ids")])
    assert error(r) == ("unsupported_parameter", "include[1]")  # made without: none kept
    assert error(await client.get(url, params={"format": "tokens"}))[1] == "format"
    with_ids = await create(client, input="Hello!", include=["output.token_ids"])
    r = await client.get(f"{RESPONSES}/{with_ids['id']}", params={"include[]": "output.token_ids"})
    assert r.json() == with_ids


async def test_input_items_are_the_responses_own_newest_first(
        client: httpx.AsyncClient) -> None:
    items = [{"role": "user", "content": "one"},
             {"type": "message", "role": "assistant", "id": "msg_mine",
              "content": [{"type": "output_text", "text": "two"}]},
             {"role": "user", "content": [{"type": "input_text", "text": "three"}]}]
    sent = await create(client, input=items, instructions="Be brief.")
    url = f"{RESPONSES}/{sent['id']}/input_items"
    page = (await client.get(url)).json()
    assert [i.get("content") for i in page["data"]] == [
        [{"type": "input_text", "text": "three"}], [{"type": "output_text", "text": "two"}],
        [{"type": "input_text", "text": "one"}]]  # as sent; instructions are not an item
    assert page["data"][1]["id"] == "msg_mine" and page["data"][0]["id"].startswith("msg_")
    assert (page["object"], page["has_more"]) == ("list", False)
    assert (page["first_id"], page["last_id"]) == (page["data"][0]["id"], page["data"][2]["id"])
    first = (await client.get(url, params={"limit": 2, "order": "asc"})).json()
    assert [i["id"] for i in first["data"]] == [page["data"][2]["id"], "msg_mine"]
    assert first["has_more"]
    rest = (await client.get(url, params={"order": "asc", "after": "msg_mine"})).json()
    assert [i["id"] for i in rest["data"]] == [page["data"][0]["id"]] and not rest["has_more"]
    assert error(await client.get(url, params={"after": "msg_none"}))[1] == "after"
    assert error(await client.get(url, params={"limit": 101}))[1] == "limit"
    plain = await create(client, input="Hi")
    [item] = (await client.get(f"{RESPONSES}/{plain['id']}/input_items")).json()["data"]
    assert (item["role"], item["content"]) == ("user", [{"type": "input_text", "text": "Hi"}])


async def test_a_continuation_starts_with_the_previous_ids_exactly(
        client: httpx.AsyncClient, fake_engine: FakeEngine, tok: HFTokenizer) -> None:
    """turn 2's prompt = turn 1's prompt + sampled + the template's close of the turn + turn 2,
    and is the prompt the same conversation gets sent whole with the returned items."""
    first = await create(client, input="Hello!", instructions="Be brief.", include=IDS)
    p1, [out] = first["input_token_ids"], first["output"]
    second = await create(client, input="And in English?", previous_response_id=first["id"],
                          include=IDS)
    assert second["previous_response_id"] == first["id"]
    assert second["instructions"] is None  # not carried over (it stays in the prompt's ids)
    p2 = second["input_token_ids"]
    closing = [tok.special_tokens["<|im_end|>"], *tok.encode("\n")]  # ChatML closes a turn
    assert p2[:len(p1) + len(out["token_ids"]) + len(closing)] == \
        p1 + out["token_ids"] + closing
    assert fake_engine.prompts[-1] == p2
    whole = await create(client, instructions="Be brief.", include=IDS, store=False,
                         tokenizer_version=first["tokenizer_version"],
                         input=[{"role": "user", "content": "Hello!"}, out,
                                {"role": "user", "content": "And in English?"}])
    assert whole["input_token_ids"] == p2
    third = await create(client, input="Thanks.", previous_response_id=second["id"],
                         include=IDS)
    p3 = third["input_token_ids"]
    assert p3[:len(p2) + len(second["output"][0]["token_ids"])] == \
        p2 + second["output"][0]["token_ids"]
    items = (await client.get(f"{RESPONSES}/{third['id']}/input_items")).json()["data"]
    assert [i["content"] for i in items] == [[{"type": "input_text", "text": "Thanks."}]]


async def test_a_tool_round_trip_by_id(make_app: Any, fake_engine: FakeEngine,
                                       tok: HFTokenizer) -> None:
    fake_engine.script = tok.encode(OUTPUT)
    async with serve_in_process(make_app()) as c:
        first = await create(c, input="Weather in Paris and Rome?", tools=[TOOL], include=IDS)
        calls = [i for i in first["output"] if i["type"] == "function_call"]
        assert [json.loads(i["arguments"])["city"] for i in calls] == ["Paris", "Rome"]
        sampled = [t for i in first["output"] for t in i["token_ids"]]
        results = [{"type": "function_call_output", "call_id": i["call_id"], "output": "sunny"}
                   for i in calls]
        second = await create(c, input=results, previous_response_id=first["id"], include=IDS)
        assert second["tools"] == first["tools"]  # kept: they are in the prompt
        p1 = first["input_token_ids"]
        assert second["input_token_ids"][:len(p1) + len(sampled)] == p1 + sampled
        r = await c.post(RESPONSES, json={"model": MODEL, "input": results,
                                          "previous_response_id": first["id"],
                                          "tools": [{**TOOL, "name": "other"}]})
        assert error(r) == ("invalid_value", "tools")
        # the fallback applies only where versions differ: here nothing is translated
        again = await create(c, input=results, previous_response_id=first["id"], include=IDS,
                             tokenizer_fallback="translate")
        assert again["input_token_ids"] == second["input_token_ids"]
        assert "warnings" not in again


async def test_another_key_never_sees_a_response(make_app: Any) -> None:
    async with serve_in_process(make_app(api_keys=["alice", "bob"])) as c:
        alice = {"Authorization": "Bearer alice"}
        bob = {"Authorization": "Bearer bob"}
        r = await c.post(RESPONSES, json={"model": MODEL, "input": "Hi"}, headers=alice)
        rid = r.json()["id"]
        for method, path in (("GET", rid), ("DELETE", rid), ("GET", f"{rid}/input_items")):
            got = await c.request(method, f"{RESPONSES}/{path}", headers=bob)
            assert error(got, 404)[0] == "response_not_found"
        r = await c.post(RESPONSES, json={"model": MODEL, "input": "and?",
                                          "previous_response_id": rid}, headers=bob)
        assert error(r, 404) == ("previous_response_not_found", "previous_response_id")
        assert (await c.get(f"{RESPONSES}/{rid}", headers=alice)).status_code == 200


async def test_without_storage(make_app: Any) -> None:
    async with serve_in_process(make_app(storage="none")) as c:
        plain = await create(c, input="Hi")
        assert plain["store"] is False
        r = await c.post(RESPONSES, json={"model": MODEL, "input": "Hi", "store": True})
        assert error(r) == ("unsupported_parameter", "store")
        r = await c.post(RESPONSES, json={"model": MODEL, "input": "Hi",
                                          "previous_response_id": "resp_1"})
        assert error(r) == ("unsupported_parameter", "previous_response_id")
        assert error(await c.get(f"{RESPONSES}/resp_1")) == ("unsupported_parameter", "store")


async def test_a_record_of_another_tokenizer_version_is_refused_by_name(
        app: Any, client: httpx.AsyncClient) -> None:
    first = await create(client, input="Hi")
    store = app.state.responses.stored._store
    record = await store.get_response("", first["id"])
    await store.put_response(StoredResponse(**{**record.__dict__, "id": "resp_old",
                                               "tokenizer_version": "smollm2-49k@sha256:00"}))
    r = await client.post(RESPONSES, json={"model": MODEL, "input": "and?",
                                           "previous_response_id": "resp_old"})
    assert error(r) == ("tokenizer_version_mismatch", "previous_response_id")
    # a version this server does not have cannot be translated either
    r = await client.post(RESPONSES, json={"model": MODEL, "input": "and?",
                                           "previous_response_id": "resp_old",
                                           "tokenizer_fallback": "translate"})
    assert error(r) == ("tokenizer_version_mismatch", "previous_response_id")
    await store.put_response(StoredResponse(**{**record.__dict__, "id": "resp_tmpl",
                                               "template_version": "other"}))
    r = await client.post(RESPONSES, json={"model": MODEL, "input": "and?",
                                           "previous_response_id": "resp_tmpl",
                                           "tokenizer_fallback": "translate"})
    assert error(r) == ("invalid_value", "previous_response_id")


async def test_a_record_of_another_known_version_is_continued_through_translate(
        app: Any, client: httpx.AsyncClient, registry: TokenizerRegistry,
        tok: HFTokenizer) -> None:
    """The model was re-pinned since: its kept ids are translated (with a warning), or the
    continuation is refused by name."""
    first = await create(client, input="Hi", include=IDS)
    store = app.state.responses.stored._store
    record = await store.get_response("", first["id"])
    other = registry.register(other_tokenizer(), aliases=["tiny"])
    old = other.tokenizer
    prompt = old.encode(tok.decode(record.prompt_ids))
    sampled = old.encode(tok.decode(record.output_ids))
    await store.put_response(StoredResponse(**{
        **record.__dict__, "id": "resp_other", "tokenizer_version": other.version,
        "vocab_size": old.vocab_size, "prompt_ids": prompt, "output_ids": sampled}))
    r = await client.post(RESPONSES, json={"model": MODEL, "input": "and?",
                                           "previous_response_id": "resp_other"})
    assert error(r) == ("tokenizer_version_mismatch", "previous_response_id")
    got = await create(client, input="and?", previous_response_id="resp_other", include=IDS,
                       tokenizer_fallback="translate")
    assert [w["code"] for w in got["warnings"]] == ["previous_response_translated"]
    tr = translator(old, tok)
    kept = tr.translate(prompt).token_ids + tr.translate(sampled).token_ids
    assert got["input_token_ids"][:len(kept)] == kept


async def events(client: httpx.AsyncClient, payload: dict[str, Any]) -> list[dict[str, Any]]:
    return typed_events(await client.post(RESPONSES, json={"model": MODEL, **payload,
                                                           "stream": True}))


async def test_a_stream_is_stored_as_it_ends(client: httpx.AsyncClient) -> None:
    evs = await events(client, {"input": "Hello!"})
    assert evs[-1]["type"] == "response.completed"
    done = evs[-1]["response"]
    assert done["store"] is True
    assert (await client.get(f"{RESPONSES}/{done['id']}")).json() == done


async def test_a_failed_write_fails_the_stream(app: Any, client: httpx.AsyncClient,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(record: StoredResponse) -> None:
        raise StorageError("the disk is gone")

    monkeypatch.setattr(app.state.responses.stored._store, "put_response", broken)
    evs = await events(client, {"input": "Hello!"})
    assert evs[-1]["type"] == "response.failed"
    assert evs[-1]["response"]["error"]["code"] == "storage_unavailable"
    assert not any(e["type"] == "response.completed" for e in evs)
    r = await client.post(RESPONSES, json={"model": MODEL, "input": "Hello!"})
    assert error(r, 503) == ("storage_unavailable", None)


@pytest.mark.parametrize("raised", [InvalidTokenIdError("an id past the vocabulary"),
                                    RuntimeError("a bug")], ids=["ours", "unexpected"])
async def test_any_failure_to_keep_fails_the_stream_in_its_lifecycle(
        app: Any, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch,
        raised: Exception) -> None:
    """Not only the store's own errors: whatever keeping the response raises ends the stream
    with a numbered `response.failed`, never a bare error event."""
    async def broken(record: StoredResponse) -> None:
        raise raised

    monkeypatch.setattr(app.state.responses.stored._store, "put_response", broken)
    evs = await events(client, {"input": "Hello!"})
    assert evs[-1]["type"] == "response.failed"
    assert evs[-1]["response"]["error"]["code"] == (
        "invalid_token_id" if isinstance(raised, InvalidTokenIdError) else "internal_error")
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    assert not any(e["type"] == "response.completed" for e in evs)


async def test_records_past_retention_are_swept(make_app: Any) -> None:
    """`storage_retention_days`: kept records go when they are that old (here five seconds,
    swept every second); until then they read back."""
    async with serve_in_process(make_app(storage_retention_days=5 / 86_400)) as c:
        sent = await create(c, input="Hello!")
        r = await c.post("/v1/chat/completions", json={
            "model": MODEL, "store": True, "messages": [{"role": "user", "content": "Hi"}]})
        chat_id = r.json()["id"]
        urls = [f"{RESPONSES}/{sent['id']}", f"/v1/chat/completions/{chat_id}"]
        assert [(await c.get(u)).status_code for u in urls] == [200, 200]
        for _ in range(150):
            if [(await c.get(u)).status_code for u in urls] == [404, 404]:
                break
            await anyio.sleep(0.1)
        assert error(await c.get(urls[0]), 404)[0] == "response_not_found"
        assert (await c.get(urls[1])).status_code == 404
        r = await c.post(RESPONSES, json={"model": MODEL, "input": "and?",
                                          "previous_response_id": sent["id"]})
        assert error(r, 404) == ("previous_response_not_found", "previous_response_id")


async def test_a_record_reads_back_as_it_was_kept(app: Any, client: httpx.AsyncClient) -> None:
    """The kept JSON itself, not re-validated: a record written by another release (a field
    today's model lacks, one it requires missing) reads back as it went out."""
    first = await create(client, input="Hi")
    store = app.state.responses.stored._store
    record = await store.get_response("", first["id"])
    kept = {k: v for k, v in record.response.items() if k != "usage"}
    kept["a_field_of_a_later_release"] = {"x": 1}
    await store.put_response(StoredResponse(**{**record.__dict__, "id": "resp_other_release",
                                               "response": kept}))
    r = await client.get(f"{RESPONSES}/resp_other_release")
    assert r.status_code == 200 and r.json() == kept

"""The proposal's loop, counted: store a document as ids -> search -> chat with the document
by reference and ids-only output -> store the completion -> read it back as ids, with
`tokenwire_tokenizer_conversions_total` read from /metrics of every tokenwire process serving
it (the live server and, behind a gateway, a tokenwire upstream). On a server without a
content policy it converts nothing (tests/storage/test_loop.py); here, with one, only the
policy reads text. The helpers are shared with tests/storage/test_loop.py."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import LiveServer
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"
CONVERSIONS = "tokenwire_tokenizer_conversions_total"
PASSAGES = ["The river Loire is the longest river in France.",
            "Honey bees live in colonies led by a queen.",
            "The violin has four strings tuned in fifths."]
QUESTION = "Which river is the longest in France?"

Counts = dict[tuple[str, str, str], float]


def conversions(live: LiveServer) -> Counts:
    """(server, direction, reason) -> count, of every tokenwire process serving the loop."""
    urls = {"gateway": live.url}
    if live.upstream is not None and live.upstream.name == "tokenwire":
        urls["upstream"] = live.upstream.url
    out: Counts = {}
    for who, url in urls.items():
        text = httpx.get(f"{url}/metrics").text
        out |= {(who, s.labels["direction"], s.labels["reason"]): s.value
                for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == CONVERSIONS}
    return out


def delta(before: Counts, after: Counts) -> Counts:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def holds(c: httpx.Client, document_id: str) -> list[int]:
    """A document's ids (read as ids: no conversion)."""
    ids: list[int] = c.get(f"/v1/documents/{document_id}").json()["token_ids"]
    return ids


def id_loop(c: httpx.Client, tok: HFTokenizer, passages: list[list[int]],
            question: list[int]) -> list[int]:
    """The loop in ids: the ids a client holds go in, the ids it keeps come back."""
    v = tok.version
    for p in passages:
        assert c.post("/v1/documents", json={"token_ids": p, "tokenizer_version": v}) \
            .status_code == 200
    hits = c.post("/v1/documents/search", json={
        "query": {"token_ids": question, "tokenizer_version": v}, "limit": 1}).json()["data"]
    assert holds(c, hits[0]["document_id"]) == passages[0]
    r = c.post("/v1/chat/completions", json={
        "model": MODEL, "tokenizer_version": v, "max_tokens": 12, "temperature": 0,
        "store": True, "response_format_tokens": "only",
        "messages": [{"role": "user", "content": [
            {"type": "input_document", "document_id": hits[0]["document_id"]},
            {"type": "input_tokens", "token_ids": question}]}]})
    assert r.status_code == 200, r.text
    sampled: list[int] = r.json()["choices"][0]["message"]["token_ids"]
    assert r.json()["choices"][0]["message"]["content"] is None
    back = c.get(f"/v1/chat/completions/{r.json()['id']}", params={"format": "tokens"}).json()
    assert back["choices"][0]["message"]["token_ids"] == sampled
    assert back["tokenizer_version"] == v
    return sampled


def text_loop(c: httpx.Client, first: list[int]) -> str:
    """The same loop with text at both ends."""
    for p in PASSAGES:
        assert c.post("/v1/documents", json={"text": p}).status_code == 200
    hits = c.post("/v1/documents/search", json={"query": QUESTION, "limit": 1}).json()["data"]
    assert holds(c, hits[0]["document_id"]) == first
    r = c.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 12, "temperature": 0, "store": True,
        "messages": [{"role": "user", "content": [
            {"type": "input_document", "document_id": hits[0]["document_id"]},
            {"type": "text", "text": QUESTION}]}]})
    assert r.status_code == 200, r.text
    content: str = r.json()["choices"][0]["message"]["content"]
    back = c.get(f"/v1/chat/completions/{r.json()['id']}", params={"format": "text"}).json()
    assert back["choices"][0]["message"]["content"] == content
    return content


def test_behind_a_gateway_and_a_content_policy_only_the_policy_reads_text(
        live_server: LiveServer, tok: HFTokenizer) -> None:
    """The live server (embedded, or a gateway in front of a real upstream) has a content
    policy with blocked phrases: it must read the prompt and the output as text, and that is
    all the id loop costs, on the gateway and on a tokenwire upstream alike."""
    passages = [tok.encode(p) for p in PASSAGES]
    question = tok.encode(QUESTION)
    with httpx.Client(base_url=live_server.url, timeout=120) as c:
        id_loop(c, tok, passages, question)
        before = conversions(live_server)
        id_loop(c, tok, passages, question)
        moved = delta(before, conversions(live_server))
    assert {(who, direction, reason) for (who, direction, reason) in moved} == \
        {("gateway", "decode", "policy")}, moved


def test_a_deleted_document_leaves_the_loop(live_server: LiveServer,
                                            tok: HFTokenizer) -> None:
    """`DELETE /v1/documents/{id}` on the live server: the search no longer finds it, a chat
    naming it is a 404 naming the block; a document kept beside it is still found."""
    v = tok.version
    with httpx.Client(base_url=live_server.url, timeout=120) as c:
        made = [c.post("/v1/documents", json={"token_ids": tok.encode(p),
                                              "tokenizer_version": v}).json()["id"]
                for p in ("Otters hold hands while they sleep.",
                          "Otters use stones as tools.")]
        query = {"query": {"token_ids": tok.encode("Otters sleep"), "tokenizer_version": v},
                 "limit": 10}

        def found() -> list[str]:
            hits = c.post("/v1/documents/search", json=query).json()["data"]
            return [h["document_id"] for h in hits if h["document_id"] in made]

        assert set(found()) == set(made)
        r = c.delete(f"/v1/documents/{made[0]}")
        assert r.json() == {"id": made[0], "object": "document", "deleted": True}
        assert found() == [made[1]]
        r = c.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
                {"type": "input_document", "document_id": made[0]}]}]})
        assert r.status_code == 404
        assert (r.json()["error"]["code"], r.json()["error"]["param"]) == \
            ("document_not_found", "messages[0].content[0].document_id")

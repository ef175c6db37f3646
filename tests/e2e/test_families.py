"""Two tokenizer families, real processes: a conversation held in SmolLM2 ids continued on
Gemma 3 through `tokenizer_fallback: "translate"`, and a migration (the server restarted with
the other model) after which the old version still answers and old ids still converse.

Each server is a real `tokenwire serve` process reached over HTTP. The prefix cache is off and
one sequence runs at a time, so a streamed and a whole request with the same seed compute the
same numbers (with cached cells, greedy text may differ: docs/engines.md, exactness).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TEST_UPSTREAM
from tests.upstreams import Upstream, free_port
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = [pytest.mark.slow, pytest.mark.engine,
              pytest.mark.skipif(bool(TEST_UPSTREAM), reason="embedded engines only: run once")]

SMOL, GEMMA = "smollm2", "gemma3"
_ONE_AT_A_TIME = "max_model_len=2048,n_parallel=1,prefix_cache=false"


def _serve(tmp: Path, store: Path, *models: str) -> Upstream:
    port = free_port()
    cmd = [sys.executable, "-m", "tokenwire", "serve", "--port", str(port)]
    for spec in models:
        cmd += ["--model", spec]
    return Upstream("tokenwire", cmd, port, tmp / f"serve-{port}.log",
                    env={"TOKENWIRE_TOKENIZER_STORE": str(store)}).start()


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    """One process serving both families, each on its own engine."""
    tmp = tmp_path_factory.mktemp("families")
    server = _serve(tmp, tmp / "store", f"smollm2-135m,name={SMOL},{_ONE_AT_A_TIME}",
                    f"gemma3-270m,name={GEMMA},{_ONE_AT_A_TIME}")
    yield server
    server.stop()


def _user(tok: HFTokenizer, text: str) -> dict[str, Any]:
    return {"role": "user", "content": {"type": "input_tokens", "token_ids": tok.encode(text)}}


def _stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_a_smollm2_conversation_continues_on_gemma(
        both: Upstream, tok: HFTokenizer, gemma_tok: HFTokenizer) -> None:
    """Every invariant of docs/api.md, in the client's (SmolLM2's) version, while Gemma samples."""
    url = both.url
    # turn 1, on SmolLM2, in SmolLM2 ids
    first = [_user(tok, "Name a colour.")]
    r1 = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": SMOL, "messages": first, "max_tokens": 12, "temperature": 0,
        "tokenizer_version": tok.version, "response_format_tokens": True}).json()
    assert r1["token_ids_source"] == "sampled" and r1["tokenizer_version"] == tok.version
    sampled = r1["choices"][0]["message"]["token_ids"]
    # turn 2, on Gemma: the history is SmolLM2 ids (the assistant's as sampled)
    history = [*first, {"role": "assistant", "token_ids": sampled},
               _user(tok, "And another one, please.")]
    body = {"model": GEMMA, "messages": history, "max_tokens": 24, "temperature": 0,
            "seed": 7, "tokenizer_version": tok.version, "tokenizer_fallback": "translate",
            "response_format_tokens": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}}
    whole = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                       json={k: v for k, v in body.items() if k != "stream_options"}).json()
    choice = whole["choices"][0]
    ids, content = choice["message"]["token_ids"], choice["message"]["content"]
    assert whole["model"] == GEMMA
    assert whole["tokenizer_version"] == tok.version
    assert whole["token_ids_source"] == "translated"
    assert choice["token_ids"] == ids and ids
    assert "prompt_token_ids" not in whole  # Gemma's ids: the client does not hold them
    assert ids == tok.encode(content)  # the client's canonical encoding of Gemma's text
    assert not set(ids) & set(tok.special_tokens.values())

    frames = _stream(url, body)
    streamed: list[int] = []
    text = ""
    finish: dict[str, Any] = {}
    for f in frames:
        assert f["tokenizer_version"] == tok.version
        assert f["token_ids_source"] == "translated"
        for ch in f["choices"]:
            streamed += ch["delta"]["token_ids"]
            text += ch["delta"].get("content") or ""
            if ch.get("finish_reason"):
                finish = ch
    assert streamed == ids  # concat(delta.token_ids) == the non-stream token_ids
    assert text == content == tok.decode(streamed)  # == decode(concat(delta.token_ids))
    assert finish["finish_reason"] == choice["finish_reason"]
    assert finish.get("stop_reason") == choice.get("stop_reason")
    if choice["finish_reason"] == "stop":  # Gemma's end of turn, said in SmolLM2's ids
        assert choice.get("stop_reason") == tok.special_tokens["<|im_end|>"]
    usage = frames[-1]["usage"]
    assert frames[-1]["choices"] == [] and usage == whole["usage"]

    # what Gemma was fed: the history's text in Gemma's ids (the render endpoint shows it)
    render = httpx.post(f"{url}/v1/chat/completions/render", timeout=60, json={
        k: v for k, v in body.items() if k not in ("stream_options", "seed")}).json()
    assert render["tokenizer_version"] == gemma_tok.version
    said = gemma_tok.encode(tok.decode(sampled))
    prompt = render["token_ids"]
    assert any(prompt[i:i + len(said)] == said for i in range(len(prompt)))

    # logprobs in the client's version: the model's tokens, SmolLM2's id where one exists
    scored = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        **{k: v for k, v in body.items() if k != "stream_options"}, "logprobs": True,
        "top_logprobs": 2}).json()["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in scored) == content
    for e in scored:
        one = tok.encode(bytes(e["bytes"]).decode("utf-8", errors="strict"))
        assert e.get("id") == (one[0] if len(one) == 1 else None)

    # turn 3 feeds turn 2's translated ids back verbatim: they are SmolLM2 ids like any other
    third = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        **body, "stream": False, "stream_options": None,
        "messages": [*history, {"role": "assistant", "token_ids": ids},
                     _user(tok, "Thanks!")], "max_tokens": 4}).json()
    assert third["tokenizer_version"] == tok.version and third["choices"][0]["token_ids"]


def test_a_migration_keeps_the_old_version_and_its_conversations(
        tmp_path: Path, tok: HFTokenizer, gemma_tok: HFTokenizer) -> None:
    """Served SmolLM2 yesterday, Gemma today (same store): the old version still tokenizes,
    detokenizes and translates, and a client holding old ids carries on through translate."""
    store = tmp_path / "store"
    old = _serve(tmp_path, store, "smollm2-135m,max_model_len=2048,n_parallel=1")
    try:
        messages = [_user(tok, "Say one word.")]
        r = httpx.post(f"{old.url}/v1/chat/completions", timeout=120, json={
            "model": httpx.get(f"{old.url}/v1/models").json()["data"][0]["id"],
            "messages": messages, "max_tokens": 8, "temperature": 0,
            "tokenizer_version": tok.version, "return_token_ids": True}).json()
        held = r["choices"][0]["token_ids"]
    finally:
        old.stop()

    new = _serve(tmp_path, store, "gemma3-270m,max_model_len=2048,n_parallel=1")
    try:
        url = new.url
        [card] = httpx.get(f"{url}/v1/models").json()["data"]
        assert card["tokenizer_version"] == gemma_tok.version
        entries = {e["id"]: e for e in httpx.get(f"{url}/v1/tokenizers").json()["data"]}
        assert entries[tok.version]["models"] == []  # kept, served by no model
        t = httpx.post(f"{url}/v1/tokenize", json={
            "tokenizer_version": tok.version, "prompt": "Hello world",
            "add_special_tokens": False}).json()
        assert t["tokens"] == tok.encode("Hello world")
        d = httpx.post(f"{url}/v1/detokenize", json={
            "tokenizer_version": tok.version, "tokens": held}).json()
        assert d["prompt"] == tok.decode(held)
        tr = httpx.post(f"{url}/v1/tokenizers/translate", json={
            "from": tok.version, "to": gemma_tok.version, "token_ids": held}).json()
        assert tr["token_ids"] == gemma_tok.encode(tok.decode(held)) and tr["lossless"]
        # the old conversation, in old ids, continues on the new model
        frames = _stream(url, {
            "model": card["id"], "max_tokens": 12, "temperature": 0,
            "messages": [*messages, {"role": "assistant", "token_ids": held},
                         _user(tok, "One more.")],
            "tokenizer_version": tok.version, "tokenizer_fallback": "translate",
            "response_format_tokens": True})
        ids = [t for f in frames for ch in f["choices"] for t in ch["delta"]["token_ids"]]
        text = "".join(ch["delta"].get("content") or "" for f in frames for ch in f["choices"])
        assert ids and ids == tok.encode(text)
        assert all(f["tokenizer_version"] == tok.version for f in frames)
        # without the fallback, old ids are refused by name, naming the model's version
        refused = httpx.post(f"{url}/v1/chat/completions", json={
            "model": card["id"], "messages": messages, "tokenizer_version": tok.version})
        err = refused.json()["error"]
        assert refused.status_code == 400 and err["code"] == "tokenizer_version_mismatch"
        assert gemma_tok.version in err["message"]
    finally:
        new.stop()

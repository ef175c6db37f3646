"""Tokenize, detokenize and the published tokenizer versions, in process."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer as RawHFTokenizer

from tests.conftest import serve_in_process
from tests.fakes import MODEL, other_tokenizer
from tokenwire.tokenizers.hf import HFTokenizer
from tokenwire.tokenizers.registry import TokenizerRegistry

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                         {"type": "input_tokens", "token_ids": [19556, 17]}]},
            {"role": "assistant", "token_ids": [30904, 24583]},
            {"role": "user", "content": "Again <|im_start|>"}]


@pytest.fixture
def tiny(registry: TokenizerRegistry) -> str:
    """A version no model serves, with a chat template of its own."""
    return registry.register(other_tokenizer(), aliases=["tiny"],
                             chat_template="{% for m in messages %}<s>{{ m['content'] }}</s>"
                             "{% endfor %}").version


async def test_tokenize_prompt(client: httpx.AsyncClient, tok: HFTokenizer) -> None:
    r = await client.post("/v1/tokenize", json={"model": MODEL, "prompt": "Hello <|im_end|>",
                                                "return_token_strs": True})
    data = r.json()
    assert data["tokens"] == tok.encode("Hello <|im_end|>")
    assert data["count"] == len(data["tokens"])
    assert data["max_model_len"] == 2048
    assert data["tokenizer_version"] == tok.version
    assert data["token_strs"] == [tok.token_str(i) for i in data["tokens"]]
    assert "Hello" in data["token_strs"]
    # vLLM's root path answers too
    assert (await client.post("/tokenize", json={"model": MODEL, "prompt": "Hello"})).json()[
        "tokens"] == tok.encode("Hello")


async def test_parse_special_picks_the_mode(client: httpx.AsyncClient, tok: HFTokenizer) -> None:
    """A typed control token: text by default (the server's text path), the control token with
    `parse_special` (the plain artifact's default)."""
    prompt = "Hello <|im_end|> again<|im_start|>"
    end, start = tok.special_id("<|im_end|>"), tok.special_id("<|im_start|>")

    async def tokens(**extra: object) -> list[int]:
        r = await client.post("/v1/tokenize", json={"model": MODEL, "prompt": prompt, **extra})
        assert r.status_code == 200, r.text
        return r.json()["tokens"]  # type: ignore[no-any-return]

    text = await tokens()
    assert text == await tokens(parse_special=False) == tok.encode(prompt)
    assert end not in text and start not in text
    parsed = await tokens(parse_special=True)
    assert parsed == tok.encode(prompt, parse_special=True)
    assert parsed.count(end) == 1 and parsed[-1] == start


async def test_tokenize_messages_is_the_chat_prompt(client: httpx.AsyncClient,
                                                    tok: HFTokenizer) -> None:
    tokenized = (await client.post("/v1/tokenize", json={
        "model": MODEL, "tokenizer_version": tok.version, "messages": MESSAGES})).json()
    chat = (await client.post("/v1/chat/completions", json={
        "model": MODEL, "tokenizer_version": tok.version, "messages": MESSAGES,
        "return_token_ids": True})).json()
    assert tokenized["tokens"] == chat["prompt_token_ids"]
    without = (await client.post("/v1/tokenize", json={
        "model": MODEL, "tokenizer_version": tok.version, "messages": MESSAGES,
        "add_generation_prompt": False})).json()
    assert tokenized["tokens"][:without["count"]] == without["tokens"]


async def test_versions_no_model_serves(client: httpx.AsyncClient, tiny: str) -> None:
    other = other_tokenizer()
    r = await client.post("/v1/tokenize", json={"tokenizer_version": "tiny",
                                                "prompt": "Bonjour à tous"})
    data = r.json()
    assert data["tokens"] == other.encode("Bonjour à tous")
    assert data["tokenizer_version"] == tiny and data["max_model_len"] is None
    r = await client.post("/v1/tokenize", json={"tokenizer_version": tiny, "messages": [
        {"role": "user", "content": "ça va"}]})
    assert other.decode(r.json()["tokens"]) == "<s>ça va</s>"
    r = await client.post("/v1/detokenize", json={"tokenizer_version": tiny,
                                                  "tokens": other.encode("ça va")})
    assert r.json() == {"prompt": "ça va", "tokenizer_version": tiny}


async def test_detokenize(client: httpx.AsyncClient, tok: HFTokenizer) -> None:
    ids = tok.encode("Hello, wörld 🎉")
    r = await client.post("/v1/detokenize", json={"tokenizer_version": "smollm2-49k",
                                                  "tokens": ids})
    assert r.json() == {"prompt": "Hello, wörld 🎉", "tokenizer_version": tok.version}


BAD: list[tuple[str, str, dict[str, Any], int, str, str | None]] = [
    ("neither target", "/v1/tokenize", {"prompt": "x"}, 400, "missing_required_parameter",
     "model"),
    ("both inputs", "/v1/tokenize", {"model": MODEL, "prompt": "x",
                                     "messages": [{"role": "user", "content": "x"}]}, 400,
     "invalid_value", "prompt"),
    ("no input", "/v1/tokenize", {"model": MODEL}, 400, "invalid_value", "messages"),
    ("ids in messages without version", "/v1/tokenize", {"model": MODEL, "messages": [
        {"role": "user", "content": {"type": "input_tokens", "token_ids": [1]}}]}, 400,
     "tokenizer_version_required", "tokenizer_version"),
    ("id out of range in messages", "/v1/tokenize", {"tokenizer_version": "smollm2-49k",
                                                     "messages": [{"role": "user", "content": {
                                                         "type": "input_tokens",
                                                         "token_ids": [1, 60000]}}]}, 400,
     "invalid_token_id", "messages[0].content.token_ids[1]"),
    ("unknown version", "/v1/tokenize", {"tokenizer_version": "x@sha256:0000000000000000",
                                         "prompt": "x"}, 400, "unknown_tokenizer_version",
     "tokenizer_version"),
    ("model and foreign version", "/v1/tokenize", {"model": MODEL, "tokenizer_version": "tiny",
                                                   "prompt": "x"}, 400,
     "tokenizer_version_mismatch", "tokenizer_version"),
    ("unknown model", "/v1/tokenize", {"model": "nope", "prompt": "x"}, 404,
     "model_not_found", "model"),
    ("parse_special with messages", "/v1/tokenize", {
        "model": MODEL, "messages": [{"role": "user", "content": "x"}], "parse_special": True},
     400, "invalid_value", "parse_special"),
    ("parse_special not a bool", "/v1/tokenize", {"model": MODEL, "prompt": "x",
                                                  "parse_special": "yes"}, 400,
     "invalid_type", "parse_special"),
    ("detokenize without version", "/v1/detokenize", {"model": MODEL, "tokens": [1]}, 400,
     "tokenizer_version_required", "tokenizer_version"),
    ("detokenize out of range", "/v1/detokenize", {"tokenizer_version": "smollm2-49k",
                                                   "tokens": [1, 2, 49152]}, 400,
     "invalid_token_id", "tokens[2]"),
    ("detokenize negative", "/v1/detokenize", {"tokenizer_version": "smollm2-49k",
                                               "tokens": [-1]}, 400, "invalid_token_id",
     "tokens[0]"),
    ("detokenize not ids", "/v1/detokenize", {"tokenizer_version": "smollm2-49k",
                                              "tokens": {"0": 1}}, 400, "invalid_type",
     "tokens"),
    # a string is ids as base64 (`encoding_format`): "hello" is not
    ("detokenize not base64", "/v1/detokenize", {"tokenizer_version": "smollm2-49k",
                                                 "tokens": "hello"}, 400, "invalid_value",
     "tokens"),
    ("detokenize packed negative", "/v1/detokenize", {"tokenizer_version": "smollm2-49k",
                                                      "tokens": "AQAAAP////8="}, 400,
     "invalid_token_id", "tokens[1]"),
]


@pytest.mark.parametrize(("case", "path", "payload", "status", "code", "param"), BAD,
                         ids=[b[0] for b in BAD])
async def test_bad_requests(client: httpx.AsyncClient, tiny: str, case: str, path: str,
                            payload: dict[str, Any], status: int, code: str,
                            param: str | None) -> None:
    r = await client.post(path, json=payload)
    assert r.status_code == status, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == (code, param)


async def test_tokenizer_listing(client: httpx.AsyncClient, tok: HFTokenizer, tiny: str) -> None:
    data = (await client.get("/v1/tokenizers")).json()
    assert data["object"] == "list"
    by_id = {t["id"]: t for t in data["data"]}
    mine = by_id[tok.version]
    assert mine["models"] == [MODEL] and mine["aliases"] == ["smollm2-49k"]
    assert mine["vocab_size"] == 49152 and mine["sha256"] == tok.sha256
    assert {"id": 1, "content": "<|im_start|>"} in mine["special_tokens"]
    # the text mode the artifact needs to encode text as the server does (it cannot carry it)
    assert mine["text_encoding"] == {"encode_special_tokens": True, "add_special_tokens": False}
    assert by_id[tiny]["models"] == []
    assert (await client.get(f"/v1/tokenizers/{tok.version}")).json() == mine
    assert (await client.get("/v1/tokenizers/smollm2-49k")).json() == mine
    r = await client.get("/v1/tokenizers/none@sha256:0000000000000000")
    assert r.status_code == 404 and r.json()["error"]["code"] == "tokenizer_not_found"


async def test_artifact_is_immutable_and_verifiable(client: httpx.AsyncClient,
                                                    tok: HFTokenizer) -> None:
    r = await client.get(f"/v1/tokenizers/{tok.version}/tokenizer.json")
    assert r.status_code == 200
    assert hashlib.sha256(r.content).hexdigest() == r.headers["x-tokenwire-sha256"] == tok.sha256
    assert r.headers["etag"] == f'"{tok.sha256}"'
    assert "immutable" in r.headers["cache-control"]
    raw = RawHFTokenizer.from_str(r.text)
    raw.encode_special_tokens = True
    assert raw.encode("Hello, world!", add_special_tokens=False).ids == tok.encode(
        "Hello, world!")
    again = await client.get(f"/v1/tokenizers/{tok.version}/tokenizer.json",
                             headers={"If-None-Match": r.headers["etag"]})
    assert again.status_code == 304 and not again.content
    by_alias = await client.get("/v1/tokenizers/smollm2-49k/tokenizer.json")
    assert by_alias.content == r.content
    assert by_alias.headers["cache-control"] == "no-cache"  # an alias may move


async def test_tokenize_messages_refuses_what_chat_refuses(make_app, tok: HFTokenizer,  # type: ignore[no-untyped-def]
                                                           tmp_path: Path) -> None:
    """/v1/tokenize gives exactly the chat prompt, so it refuses exactly what chat refuses:
    control ids, the message and id limits, the content policy, non-canonical ids."""
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"blocked_phrases": ["forbidden recipe"]}))
    # (raw prompts denied: a caller allowed them may send control ids in assistant history)
    app = make_app(max_messages=3, max_request_token_ids=40, content_policy=policy,
                   non_canonical_tokens="reject", raw_prompts="deny")
    im_start = tok.special_id("<|im_start|>")
    odd = tok.encode("Say only ") + tok.encode("y") + tok.encode("es.")
    assert odd != tok.encode(tok.decode(odd))

    def user(content: Any) -> dict[str, Any]:
        return {"role": "user", "content": content}

    def ids(token_ids: list[int]) -> dict[str, Any]:
        return {"type": "input_tokens", "token_ids": token_ids}

    cases: dict[str, list[dict[str, Any]]] = {
        "a control id in a block": [user([{"type": "text", "text": "hi"},
                                          ids([253, im_start])])],
        "a control id in assistant ids": [user("hi"), {"role": "assistant",
                                                       "token_ids": [253, im_start]}],
        "too many messages": [user("a"), user("b"), user("c"), user("d")],
        "too many ids": [user(ids(tok.encode("word " * 30))), user(ids(tok.encode("x " * 30)))],
        "a blocked phrase": [user("the forbidden recipe")],
        "a blocked phrase in ids": [user(ids(tok.encode("the forbidden recipe")))],
        "a phrase split across messages": [user("the forbidden"), user("recipe")],
        "non-canonical ids": [user(ids(odd))],
    }
    async with serve_in_process(app) as c:
        for name, messages in cases.items():
            body = {"model": MODEL, "tokenizer_version": tok.version, "messages": messages}
            chat = await c.post("/v1/chat/completions", json=body)
            assert chat.status_code == 400, (name, chat.text)
            r = await c.post("/v1/tokenize", json=body)
            assert (r.status_code, r.json()) == (400, chat.json()), name
        ok = {"model": MODEL, "tokenizer_version": tok.version,
              "messages": [user([{"type": "text", "text": "hi"}, ids(tok.encode(" there"))])]}
        chat = await c.post("/v1/chat/completions", json={**ok, "return_token_ids": True})
        r = await c.post("/v1/tokenize", json=ok)
        assert r.json()["tokens"] == chat.json()["prompt_token_ids"]
        # and /v1/detokenize takes no more ids than a request may send
        r = await c.post("/v1/detokenize", json={"tokenizer_version": tok.version,
                                                 "tokens": tok.encode("word " * 50)})
        assert r.status_code == 400, r.text
        assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("invalid_value",
                                                                            "tokens")


async def test_translate_both_ways(client: httpx.AsyncClient, tok: HFTokenizer,
                                   tiny: str) -> None:
    """Across two registered versions (one no model serves), by full id or alias."""
    other = other_tokenizer()
    text = "Bonjour à tous, ça va? 🎉"
    for src, dst, src_tok, dst_tok in ((tok.family, "tiny", tok, other),
                                       (tiny, tok.version, other, tok)):
        r = await client.post("/v1/tokenizers/translate",
                              json={"from": src, "to": dst, "token_ids": src_tok.encode(text)})
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["token_ids"] == dst_tok.encode(text)
        assert data["text_bytes"] == len(text.encode()) and data["lossless"] is True
        assert data["tokenizer_version"] == dst_tok.version


async def test_translate_reports_what_it_cannot_keep(client: httpx.AsyncClient,
                                                     tok: HFTokenizer, tiny: str) -> None:
    """`<|im_end|>` has no counterpart in the tiny version: its text goes, not its meaning."""
    ids = [*tok.encode("Hi"), tok.special_tokens["<|im_end|>"]]
    data = (await client.post("/v1/tokenizers/translate",
                              json={"from": tok.version, "to": tiny, "token_ids": ids})).json()
    assert data["lossless"] is False
    assert other_tokenizer().decode(data["token_ids"]) == "Hi<|im_end|>"
    # the same version: the ids themselves
    same = (await client.post("/v1/tokenizers/translate",
                              json={"from": tiny, "to": "tiny", "token_ids": [5, 300]})).json()
    assert same["token_ids"] == [5, 300] and same["lossless"] is True


@pytest.mark.parametrize(("payload", "status", "code", "param"), [
    ({"from": "nope@sha256:0123456789abcdef", "to": "tiny", "token_ids": [1]}, 404,
     "tokenizer_not_found", "from"),
    ({"from": "tiny", "to": "nope", "token_ids": [1]}, 404, "tokenizer_not_found", "to"),
    ({"from": "tiny", "to": "smollm2-49k", "token_ids": [1, 400]}, 400, "invalid_token_id",
     "token_ids[1]"),
    ({"from": "tiny", "to": "smollm2-49k", "token_ids": [-1]}, 400, None, "token_ids[0]"),
    ({"from": "tiny", "to": "smollm2-49k"}, 400, "missing_required_parameter", "token_ids"),
    ({"to": "tiny", "token_ids": []}, 400, "missing_required_parameter", "from"),
    ({"from": "tiny", "to": "tiny", "token_ids": [], "x": 1}, 400, None, "x"),
])
async def test_translate_bad_requests(client: httpx.AsyncClient, tiny: str,
                                      payload: dict[str, Any], status: int, code: str | None,
                                      param: str) -> None:
    r = await client.post("/v1/tokenizers/translate", json=payload)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code

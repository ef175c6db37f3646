"""The legacy completions endpoint's HTTP contract, on a scripted engine."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import serve_in_process
from tests.fakes import MODEL, FakeEngine
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = pytest.mark.anyio


def body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Once upon a time", **kw}


async def post(client: httpx.AsyncClient, payload: Any) -> httpx.Response:
    return await client.post("/v1/completions", json=payload)


async def test_plain_text_prompt(client: httpx.AsyncClient, tok: HFTokenizer,
                                 fake_engine: FakeEngine) -> None:
    data = (await post(client, body(max_tokens=100))).json()
    assert data["object"] == "text_completion" and data["id"].startswith("cmpl-")
    [choice] = data["choices"]
    assert set(choice) == {"text", "index", "logprobs", "finish_reason"}
    assert choice["text"] == tok.decode(fake_engine.script)
    assert fake_engine.prompts == [tok.encode("Once upon a time")]
    assert "tokenizer_version" not in data


async def test_default_max_tokens_is_16(client: httpx.AsyncClient, fake_engine: FakeEngine,
                                        tok: HFTokenizer) -> None:
    fake_engine.script = tok.encode("word " * 40)
    data = (await post(client, body())).json()
    assert data["usage"]["completion_tokens"] == 16
    assert data["choices"][0]["finish_reason"] == "length"


async def test_every_prompt_form(client: httpx.AsyncClient, tok: HFTokenizer,
                                 fake_engine: FakeEngine) -> None:
    a, b = tok.encode("Hello"), tok.encode("Bonjour")
    forms: list[tuple[Any, list[list[int]]]] = [
        ("Hello", [a]), (["Hello", "Bonjour"], [a, b]), (a, [a]), ([a, b], [a, b]),
    ]
    for prompt, fed in forms:
        fake_engine.prompts.clear()
        data = (await post(client, body(prompt=prompt, n=2, tokenizer_version=tok.version,
                                        return_token_ids=True))).json()
        assert [c["index"] for c in data["choices"]] == list(range(2 * len(fed)))
        # choice i * n + j belongs to prompt i
        assert [c["prompt_token_ids"] for c in data["choices"]] == [p for p in fed for _ in "nn"]
        assert sorted(fake_engine.prompts) == sorted(p for p in fed for _ in "nn")
        assert data["usage"]["prompt_tokens"] == sum(len(p) for p in fed)


async def test_echo_and_legacy_logprobs(client: httpx.AsyncClient, tok: HFTokenizer,
                                        fake_engine: FakeEngine) -> None:
    prompt = tok.encode("Say 🎉")
    data = (await post(client, body(prompt=prompt, tokenizer_version=tok.version, echo=True,
                                    logprobs=2, max_tokens=100))).json()
    choice = data["choices"][0]
    assert choice["text"] == tok.decode(prompt) + tok.decode(fake_engine.script)
    lp = choice["logprobs"]
    ids = prompt + fake_engine.script
    assert lp["token_ids"] == ids
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["top_token_logprobs"][0] is None
    assert [t["id"] for t in lp["top_token_logprobs"][1]] == [ids[1], ids[1] + 1]
    # offsets count characters of the choice's text; a partial character keeps its start
    text = choice["text"]
    for i, off in enumerate(lp["text_offset"]):
        before = tok.decode(ids[:i]).rstrip("\ufffd")  # the characters complete before token i
        assert (off, text[:off]) == (len(before), before), i
    assert lp["text_offset"] == sorted(lp["text_offset"])
    assert lp["text_offset"][-1] < len(text)
    assert any(t.startswith("bytes:") for t in lp["tokens"])


async def test_scoring_with_max_tokens_zero(client: httpx.AsyncClient, tok: HFTokenizer) -> None:
    data = (await post(client, body(echo=True, logprobs=0, max_tokens=0))).json()
    choice = data["choices"][0]
    assert choice["text"] == "Once upon a time"
    assert choice["finish_reason"] == "length"
    assert choice["logprobs"]["token_ids"] == tok.encode("Once upon a time")
    assert data["usage"]["completion_tokens"] == 0


async def test_stream(client: httpx.AsyncClient, tok: HFTokenizer,
                      fake_engine: FakeEngine) -> None:
    r = await post(client, body(stream=True, return_token_ids=True, echo=True, max_tokens=100,
                                stream_options={"include_usage": True}))
    frames = [f[6:] for f in r.text.split("\n\n") if f.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    first = chunks[0]["choices"][0]
    assert first["prompt_token_ids"] == tok.encode("Once upon a time")
    assert first["text"] == "Once upon a time"
    ids = [i for c in chunks for ch in c["choices"] for i in ch["token_ids"]]
    text = "".join(ch["text"] for c in chunks for ch in c["choices"])
    assert ids == fake_engine.script
    assert text == "Once upon a time" + tok.decode(ids)
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


BAD: list[tuple[str, Any, str, str | None]] = [
    ("no prompt", {"model": MODEL}, "missing_required_parameter", "prompt"),
    ("ids without version", body(prompt=[1, 2]), "tokenizer_version_required",
     "tokenizer_version"),
    ("batch without version", body(prompt=[[1], [2]]), "tokenizer_version_required",
     "tokenizer_version"),
    ("id out of range", body(prompt=[1, 2, 3, 50000], tokenizer_version="smollm2-49k"),
     "invalid_token_id", "prompt[3]"),
    ("nested id out of range", body(prompt=[[1], [2, 3, 10**9]], tokenizer_version="smollm2-49k"),
     "invalid_token_id", "prompt[1][2]"),
    ("negative id", body(prompt=[1, -2], tokenizer_version="smollm2-49k"), "invalid_token_id",
     "prompt[1]"),
    ("string in ids", body(prompt=[1, "a"], tokenizer_version="smollm2-49k"),
     "invalid_token_id", "prompt[1]"),
    ("mixed batch", body(prompt=[[1], "a"], tokenizer_version="smollm2-49k"),
     "invalid_type", "prompt[1]"),
    ("number prompt", body(prompt=5), "invalid_value", "prompt"),
    ("empty array", body(prompt=[]), "invalid_value", "prompt"),
    ("empty string", body(prompt=""), "invalid_value", "prompt"),
    ("empty inner", body(prompt=[[253], []], tokenizer_version="smollm2-49k"), "invalid_value",
     "prompt[1]"),
    ("suffix", body(suffix="end"), "unsupported_parameter", "suffix"),
    ("best_of", body(best_of=3), "unsupported_parameter", "best_of"),
    ("logit_bias id", body(logit_bias={"99999": 10}), "invalid_value", "logit_bias"),
    ("logit_bias key", body(logit_bias={"a5": 10}), "invalid_value", "logit_bias"),
    ("logit_bias value", body(logit_bias={"5": 101}), "invalid_value", "logit_bias.5"),
    ("top_k", body(top_k=-3), "invalid_value", "top_k"),
    ("min_p", body(min_p=1.5), "invalid_value", "min_p"),
    ("min_tokens", body(max_tokens=2, min_tokens=3), "invalid_value", "min_tokens"),
    ("stop_token_ids", body(stop_token_ids=[99999]), "invalid_token_id", "stop_token_ids[0]"),
    ("truncate_prompt_tokens", body(truncate_prompt_tokens=0), "invalid_value",
     "truncate_prompt_tokens"),
    ("priority", body(priority=1), "unsupported_parameter", "priority"),
    ("use_beam_search", body(use_beam_search=True), "unsupported_parameter",
     "use_beam_search"),
    ("prompt_logprobs", body(prompt_logprobs=1), "unsupported_parameter", "prompt_logprobs"),
    ("unknown field", body(response_format_tokens=True), "unknown_parameter",
     "response_format_tokens"),
    ("logprobs too many", body(logprobs=21), "invalid_value", "logprobs"),
    ("logprobs as bool", body(logprobs=True), "invalid_type", "logprobs"),
    ("negative max_tokens", body(max_tokens=-1), "invalid_value", "max_tokens"),
    ("too long", body(prompt=[253] * 2100, tokenizer_version="smollm2-49k"),
     "context_length_exceeded", "prompt"),
    ("too long in batch", body(prompt=[[253], [253] * 2100], tokenizer_version="smollm2-49k"),
     "context_length_exceeded", "prompt[1]"),
    ("unknown model", body(model="davinci"), "model_not_found", "model"),
]


@pytest.mark.parametrize(("case", "payload", "code", "param"), BAD, ids=[b[0] for b in BAD])
async def test_bad_requests(client: httpx.AsyncClient, fake_engine: FakeEngine, case: str,
                            payload: Any, code: str, param: str | None) -> None:
    r = await post(client, payload)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (code, param), err
    assert fake_engine.prompts == []
    assert (await post(client, body())).status_code == 200


async def test_a_stream_carries_its_warnings_whatever_it_shows(make_app,  # type: ignore[no-untyped-def]
                                                               tok: HFTokenizer) -> None:
    """The first chunk carries the request's warnings, also without ids or an echo (which
    used to be the only chunks that could)."""
    odd = tok.encode("forb") + tok.encode("idden")  # not the canonical encoding
    async with serve_in_process(make_app(non_canonical_tokens="flag")) as c:
        for extra in ({}, {"return_token_ids": True}, {"echo": True}):
            r = await post(c, body(prompt=odd, tokenizer_version=tok.version, stream=True,
                                   max_tokens=3, **extra))
            chunks = [json.loads(line[6:]) for line in r.text.split("\n\n")
                      if line.startswith("data: {")]
            assert chunks[0]["warnings"][0]["code"] == "non_canonical_tokens", extra
            assert all("warnings" not in c for c in chunks[1:])


async def test_truncate_minus_one_leaves_room_for_the_completion(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine) -> None:
    """vLLM's -1: as many prompt tokens as leave the completion's room (the fake context is
    2048); a prompt longer than the context then runs instead of failing."""
    long = tok.encode("word " * 3000)
    data = (await post(client, body(prompt=long, tokenizer_version=tok.version, max_tokens=16,
                                    truncate_prompt_tokens=-1))).json()
    assert data["usage"]["prompt_tokens"] == 2048 - 16
    assert fake_engine.prompts[-1] == long[-(2048 - 16):]
    r = await post(client, body(prompt=long, tokenizer_version=tok.version, max_tokens=16,
                                truncate_prompt_tokens=2040))
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"

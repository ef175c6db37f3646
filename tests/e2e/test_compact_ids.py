"""Compact ids on the real engines: tokenwire's Python client with `compact_ids` sends its ids
and reads the answer's as base64 (`encoding_format: "base64"`), and gets the ids the same
requests get as lists. Every family's fields, in process:
tests/api/test_compact_ids_http.py."""

from __future__ import annotations

import asyncio
import base64
from array import array

import httpx

from tests.conftest import LiveServer
from tokenwire.client import AsyncClient, Client

MODEL = "SmolLM2-135M-Instruct"
GREEDY = {"temperature": 0, "max_tokens": 24}


def test_the_client_gets_the_same_ids_as_base64(live_server: LiveServer) -> None:
    with Client(live_server.url + "/v1") as plain, \
            Client(live_server.url + "/v1", compact_ids=True) as compact:
        prompt = plain.tokenize(messages=[{"role": "user", "content": "Name a fruit."}],
                                model=MODEL).tokens
        assert compact.tokenize(messages=[{"role": "user", "content": "Name a fruit."}],
                                model=MODEL).tokens == prompt
        # the prompt's ids in, as an input_tokens block (base64 from the compact client)
        msgs = [{"role": "user", "content": plain.tokenize("Name a fruit.", model=MODEL,
                                                           add_special_tokens=False).tokens}]
        a = plain.chat(MODEL, msgs, **GREEDY)
        b = compact.chat(MODEL, msgs, **GREEDY)
        assert b.choices[0].token_ids == a.choices[0].token_ids and a.choices[0].token_ids
        assert b.prompt_token_ids == a.prompt_token_ids
        streamed = [c for c in compact.chat(MODEL, msgs, stream=True, **GREEDY)]
        ids = [i for c in streamed for ch in c.choices for i in ch.token_ids or []]
        assert ids == a.choices[0].token_ids
        assert compact.detokenize(ids, model=MODEL).prompt == a.choices[0].message.content

    async def completions() -> tuple[list[int] | None, list[int] | None]:
        async with AsyncClient(live_server.url + "/v1", compact_ids=True) as c, \
                AsyncClient(live_server.url + "/v1") as p:
            x = await c.complete(MODEL, "The sea is", **GREEDY)
            y = await p.complete(MODEL, "The sea is", **GREEDY)
            return x.choices[0].token_ids, y.choices[0].token_ids
    x, y = asyncio.run(completions())
    assert x == y and x

    # a whole generate answer, both ways
    body = {"model": MODEL, "token_ids": prompt, "sampling_params": {
        "temperature": 0, "max_tokens": 24}}
    lists = httpx.post(live_server.url + "/inference/v1/generate", json=body, timeout=120)
    packed = httpx.post(live_server.url + "/inference/v1/generate", timeout=120, json={
        **body, "encoding_format": "base64",
        "token_ids": base64.b64encode(array("i", prompt).tobytes()).decode()})
    assert lists.status_code == 200 and packed.status_code == 200, (lists.text, packed.text)
    want = lists.json()["choices"][0]["token_ids"]
    got = packed.json()["choices"][0]["token_ids"]
    assert array("i", base64.b64decode(got)).tolist() == want and want
    assert len(got) == 4 * -(-4 * len(want) // 3)  # 5⅓ bytes an id, whatever its digits

"""Fewer, fuller events (`stream_options.coalesce`, the server's `stream_coalesce`): tokens at
hand together go out as one event, with the same ids, text and logprobs as one event each. In
process, on a scripted engine whose events all come at once (as an upstream's in one read); the
real engines' streams are checked in tests/e2e/test_chat_openai.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import serve_in_process, stream_frames
from tests.fakes import MODEL, FakeEngine
from tokenwire.engines.base import FinishEvent, TokenEvent, TokenRun
from tokenwire.serving.generation import _Coalesced

pytestmark = pytest.mark.anyio


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}],
            "return_token_ids": True, "logprobs": True, "top_logprobs": 2, **kw}


def joined(chunks: list[dict[str, Any]]) -> tuple[list[int], str, list[Any], int]:
    """The stream's ids, text, logprob entries and how many chunks carried ids."""
    ids: list[int] = []
    text, lps, carrying = "", [], 0
    for c in chunks:
        for ch in c["choices"]:
            ids += ch.get("token_ids") or []
            text += ch["delta"].get("content") or ""
            lps += (ch.get("logprobs") or {}).get("content") or []
            carrying += bool(ch.get("token_ids"))
    return ids, text, lps, carrying


async def test_a_coalesced_chat_stream_is_the_same_stream_in_fewer_chunks(
        make_app: Any, fake_engine: FakeEngine) -> None:
    fake_engine.burst = True
    async with serve_in_process(make_app()) as client:
        each = await stream_frames(client, "/v1/chat/completions", chat())
        fewer = await stream_frames(client, "/v1/chat/completions",
                             chat(stream_options={"coalesce": True}))
    ids, text, lps, n_each = joined(each)
    assert joined(fewer)[:3] == (ids, text, lps)
    assert ids == fake_engine.script and len(lps) == len(ids)
    assert n_each == len(ids) and joined(fewer)[3] == 1  # every id at hand: one chunk


async def test_the_server_default_and_a_request_that_says_otherwise(
        make_app: Any, fake_engine: FakeEngine) -> None:
    fake_engine.burst = True
    async with serve_in_process(make_app(stream_coalesce=True)) as client:
        fewer = await stream_frames(client, "/v1/chat/completions", chat())
        each = await stream_frames(client, "/v1/chat/completions",
                            chat(stream_options={"coalesce": False}))
        completions = await stream_frames(client, "/v1/completions", {
            "model": MODEL, "prompt": "Hello", "max_tokens": 50, "logprobs": 1})
        generate = await stream_frames(client, "/inference/v1/generate", {
            "model": MODEL, "token_ids": [1, 2, 3],
            "sampling_params": {"max_tokens": 50, "logprobs": 1}})
    assert joined(fewer)[:3] == joined(each)[:3] and joined(fewer)[3] < joined(each)[3]
    # completions and generate: one event with every id
    assert len(completions[0]["choices"][0]["logprobs"]["tokens"]) == len(fake_engine.script)
    gen = [c for c in generate if c["choices"]]
    assert gen[0]["choices"][0]["token_ids"] == fake_engine.script
    assert len(gen[0]["choices"][0]["logprobs"]["content"]) == len(fake_engine.script)


async def test_nothing_waits_a_token_alone_goes_alone() -> None:
    """Only what is at hand joins: a token that arrives alone, a weight change or a mask
    goes as it is; the finish is never folded in."""

    class Script:
        def __init__(self, batches: list[list[Any]]):
            self._events = [ev for b in batches for ev in b]
            self._ends = {sum(map(len, batches[:i + 1])) for i in range(len(batches))}
            self._i = 0

        @property
        def ready(self) -> bool:
            return self._i not in self._ends and self._i < len(self._events)

        def __aiter__(self) -> Script:
            return self

        async def __anext__(self) -> Any:
            if self._i >= len(self._events):
                raise StopAsyncIteration
            self._i += 1
            return self._events[self._i - 1]

        async def aclose(self) -> None:
            pass

    t = [TokenEvent(i, -0.1 * i, ((i, -0.1 * i),)) for i in range(1, 8)]
    moved = TokenEvent(8, -0.8, (), weight_version="v2")
    done = FinishEvent("length")
    got = [ev async for ev in _Coalesced(Script([[t[0]], [t[1], t[2], t[3]], [t[4], moved, t[5],
                                                                             t[6], done]]))]
    assert got[0] == t[0]
    assert isinstance(got[1], TokenRun) and list(got[1]) == t[1:4]
    assert got[2] == t[4] and got[3] == moved
    assert isinstance(got[4], TokenRun) and list(got[4]) == t[5:7]
    assert got[5] == done and len(got) == 6

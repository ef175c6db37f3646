"""A real `tokenwire serve` (the real model, SQLite) killed with SIGKILL in the middle of a
burst of `store: true` requests: every record it acknowledged is there after the restart."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_stored_responses_openai import assert_continues
from tests.upstreams import tokenwire_upstream

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"


def test_sigkill_in_a_burst_of_stores_loses_no_acknowledged_record(tmp_path: Path) -> None:
    """Every `store: true` request answered 200 before a SIGKILL is there after the restart,
    whole; the file is consistent."""
    store = tmp_path / "records.sqlite3"
    server = tokenwire_upstream(tmp_path, n_parallel=4, env={"TOKENWIRE_STORAGE": str(store)})
    acked: list[dict[str, Any]] = []

    async def burst() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            async def one(i: int) -> None:
                try:
                    r = await c.post("/v1/chat/completions", json={
                        "model": MODEL, "store": True, "max_tokens": 2, "temperature": 0,
                        "metadata": {"i": str(i)}, "return_token_ids": True,
                        "messages": [{"role": "user", "content": f"Say {i}."}]})
                except httpx.HTTPError:
                    return  # cut off by the kill: never acknowledged
                if r.status_code == 200:
                    acked.append(r.json())

            tasks = [asyncio.create_task(one(i)) for i in range(200)]
            while len(acked) < 20:
                await asyncio.sleep(0.01)
            server.kill()  # mid-burst: requests are in flight
            await asyncio.gather(*tasks)

    try:
        asyncio.run(burst())
        assert server.proc is not None and server.proc.returncode == -9
        assert 20 <= len(acked) < 200
        with sqlite3.connect(store) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        server.start()
        with httpx.Client(base_url=server.url) as c:
            for sent in acked:
                r = c.get(f"/v1/chat/completions/{sent['id']}", params={"format": "tokens"})
                assert r.status_code == 200, sent["id"]
                got = r.json()
                assert got["prompt_token_ids"] == sent["prompt_token_ids"]
                assert got["choices"][0]["message"]["token_ids"] == \
                    sent["choices"][0]["token_ids"]
    finally:
        server.stop()


def test_a_conversation_by_id_survives_a_sigkill(tmp_path: Path) -> None:
    """Responses answered before a SIGKILL read back after the restart, and the conversation
    goes on from their exact ids (the official SDK, `previous_response_id` only)."""
    import openai

    store = tmp_path / "records.sqlite3"
    server = tokenwire_upstream(tmp_path, env={"TOKENWIRE_STORAGE": str(store)})
    ids: Any = ["input.token_ids", "output.token_ids"]
    try:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
            first = c.responses.create(model=MODEL, input="Name a colour.", temperature=0,
                                       max_output_tokens=6, include=ids)
            second = c.responses.create(model=MODEL, input="And another?", temperature=0,
                                        max_output_tokens=6, include=ids,
                                        previous_response_id=first.id)
        server.kill()
        assert server.proc is not None and server.proc.returncode == -9
        server.start()
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
            for sent in (first, second):
                got = c.responses.retrieve(sent.id)
                assert (got.output_text, got.usage) == (sent.output_text, sent.usage)
            third = c.responses.create(model=MODEL, input="Thanks.", temperature=0,
                                       max_output_tokens=6, include=ids,
                                       previous_response_id=second.id)
        assert_continues(second, third)
    finally:
        server.stop()

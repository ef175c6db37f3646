"""A real `tokenwire serve` (the real model, SQLite) killed with SIGKILL in the middle of a
burst of `store: true` requests: every record it acknowledged is there after the restart."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

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

"""`storage_retention_days` on a real `tokenwire serve` (the real model, SQLite, the official
SDK): records older than the retention are gone after a restart with it set; the rest read back
and go on from their exact ids."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.test_stored_responses_openai import assert_continues
from tests.upstreams import tokenwire_upstream

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
DAY = 86_400


def test_a_restart_with_retention_deletes_what_is_older(tmp_path: Path) -> None:
    store = tmp_path / "records.sqlite3"
    server = tokenwire_upstream(tmp_path, env={"TOKENWIRE_STORAGE": str(store)})
    ids: Any = ["input.token_ids", "output.token_ids"]
    try:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
            old = c.responses.create(model=MODEL, input="Name a colour.", temperature=0,
                                     max_output_tokens=6)
            chat = c.chat.completions.create(
                model=MODEL, store=True, max_tokens=4, temperature=0,
                messages=[{"role": "user", "content": "Name a fruit."}])
            kept = c.responses.create(model=MODEL, input="Name a tree.", temperature=0,
                                      max_output_tokens=6, include=ids)
        server.stop()
        # 31 days pass for two of the three
        with sqlite3.connect(store) as db:
            for table, id in (("responses", old.id), ("completions", chat.id)):
                db.execute(f"UPDATE {table} SET created = created - ? WHERE id = ?",
                           (31 * DAY, id))
        server.env["TOKENWIRE_STORAGE_RETENTION_DAYS"] = "30"
        server.start()
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
            deadline = time.monotonic() + 30  # the first sweep runs beside the start
            while "deleted 2 stored records" not in server.log.read_text():
                assert time.monotonic() < deadline, server.log.read_text()[-2000:]
                time.sleep(0.1)
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(old.id)
            with pytest.raises(openai.NotFoundError):
                c.chat.completions.retrieve(chat.id)
            with pytest.raises(openai.NotFoundError):
                c.responses.create(model=MODEL, input="Another?", previous_response_id=old.id)
            assert c.responses.retrieve(kept.id).output_text == kept.output_text
            more = c.responses.create(model=MODEL, input="Another?", temperature=0,
                                      max_output_tokens=6, include=ids,
                                      previous_response_id=kept.id)
        assert_continues(kept, more)
    finally:
        server.stop()

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.conftest import LiveServer


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Iterator[openai.OpenAI]:
    """The official `openai` client on the live server (no retries: a failure shows once)."""
    with openai.OpenAI(base_url=live_server.base_url, api_key="unused", max_retries=0) as c:
        yield c

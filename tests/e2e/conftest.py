from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.conftest import LiveServer
from tests.upstreams import Upstream, tokenwire_upstream


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Iterator[openai.OpenAI]:
    """The official `openai` client on the live server (no retries: a failure shows once)."""
    with openai.OpenAI(base_url=live_server.base_url, api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Upstream]]:
    """Two `tokenwire serve` upstreams (the embedded engine) for a module's gateways, a core's
    worth of threads each: two engines with all cores each spin against each other at every
    OpenMP barrier (measured: 1-2 tokens/s per stream on 2 cores, against ~100 alone)."""
    tmp = tmp_path_factory.mktemp("two")
    one_core = {"TOKENWIRE_N_THREADS": "1"}
    ups = [tokenwire_upstream(tmp, env=one_core), tokenwire_upstream(tmp, env=one_core)]
    yield ups
    for u in ups:
        u.stop()

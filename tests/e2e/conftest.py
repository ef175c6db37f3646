from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

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
    # Started side by side, not one after the other: each start is mostly a Python import, a
    # model load and the engine's self-check, one core's work, so on two cores the pair is up in
    # ~4.6 s instead of ~7.6 s (measured), for each of the three modules that use it. The
    # fixture stays per module: test_gateway, test_workers and test_rolling kill, pause and
    # relabel these replicas, so one pair for the session would carry one module's state into
    # the next.
    ups = start_together(*[lambda port=port: tokenwire_upstream(tmp, port=port, env=one_core)
                           for port in free_ports(2)])
    yield ups
    for u in ups:
        u.stop()


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports (held together while picked: upstreams started at once cannot
    be handed the same one)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def start_together(*starts: Callable[[], Upstream]) -> list[Upstream]:
    """Run each start (which returns once its upstream serves) in a thread of its own; the
    upstreams in the order given. If one fails, those that started are stopped and its error
    raised."""
    done: list[Upstream | None] = [None] * len(starts)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            done[i] = starts[i]()
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(starts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for u in done:
            if u is not None:
                u.stop()
        raise errors[0]
    return [u for u in done if u is not None]

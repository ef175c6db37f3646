"""The metrics without HTTP: what an engine offers is watched, what it lacks left out."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from tokenwire.engines.base import EngineBase
from tokenwire.metrics import ITL_BUCKETS, Metrics


def samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(m.render().decode()) for s in f.samples}


class _Stepping(EngineBase):
    """Like the embedded engine: queues, and a hook its worker thread calls after each decode;
    a process of its own where `restarts` is given."""

    n_active = 3
    n_waiting = 1

    def __init__(self, restarts: int | None = None) -> None:
        self.on_step: Callable[[int], None] | None = None
        self._restarts = restarts

    @property
    def restarts(self) -> int | None:
        return self._restarts


def test_an_engine_that_never_steps_restarts_or_moves_has_no_such_series() -> None:
    """Every engine has queues (`Engine`); steps, restarts and migrations only where they
    happen (a gateway never steps, only the embedded engine has a process to restart)."""
    m = Metrics()
    m.attach("gw", _Stepping())  # type: ignore[arg-type]
    m.attach("own", _Stepping(restarts=2))  # type: ignore[arg-type]
    got = samples(m)
    names = {name for name, labels in got if ("model_name", "gw") in labels}
    assert names == {"tokenwire_num_requests_running", "tokenwire_num_requests_waiting"}
    assert got[("tokenwire_engine_restarts", (("model_name", "own"),))] == 2


def test_steps_from_another_thread_and_queues_read_at_scrape_time() -> None:
    m = Metrics()
    engine = _Stepping()
    m.attach("m", engine)  # type: ignore[arg-type]
    hook = engine.on_step
    assert hook is not None
    worker = threading.Thread(target=lambda: [hook(n) for n in (5, 1, 1, 2)])
    worker.start()
    worker.join()
    got = samples(m)
    label = (("model_name", "m"),)
    assert got[("tokenwire_iteration_tokens_total_count", label)] == 4
    assert got[("tokenwire_iteration_tokens_total_sum", label)] == 9
    assert got[("tokenwire_num_requests_running", label)] == 3
    engine.n_active = 0
    assert samples(m)[("tokenwire_num_requests_running", label)] == 0
    assert samples(m)[("tokenwire_num_requests_waiting", label)] == 1


def test_a_clock_times_the_first_token_then_the_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gaps are tallied and added every 64 tokens and at the end, into the same buckets
    as `Histogram.observe` puts them (a gap on a bound is in that bound's bucket)."""
    m = Metrics()
    now = [100.0]
    monkeypatch.setattr("tokenwire.metrics.time.monotonic", lambda: now[0])
    clock = m.timer("m").clock()
    gaps = [0.02, 0.02, 0.003, 25.0] + [0.005] * 64  # on a bound, between, past the last
    ref = Histogram("ref", "", buckets=ITL_BUCKETS, registry=CollectorRegistry())
    for gap in [0.5, *gaps]:  # the first: time to first token
        now[0] += gap
        clock.token()
    label = (("model_name", "m"),)
    assert samples(m)[("tokenwire_inter_token_latency_seconds_count", label)] == 64  # so far
    clock.close()
    for gap in gaps:
        ref.observe(gap)
    got = samples(m)
    assert got[("tokenwire_time_to_first_token_seconds_count", label)] == 1
    want = {s.labels.get("le"): s.value for s in ref.collect()[0].samples
            if s.name.endswith(("_bucket", "_count"))}
    for le, value in want.items():
        key = ("tokenwire_inter_token_latency_seconds_" + ("bucket" if le else "count"),
               (("le", le), ("model_name", "m")) if le else label)
        assert got[key] == value, (le, got.get(key), value)
    assert got[("tokenwire_inter_token_latency_seconds_sum", label)] == pytest.approx(sum(gaps))

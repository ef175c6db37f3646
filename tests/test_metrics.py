"""The metrics without HTTP: what an engine offers is watched, what it lacks left out."""

from __future__ import annotations

import threading
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from tokenwire.metrics import Metrics


def samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(m.render().decode()) for s in f.samples}


class _Stepping:
    """Like the embedded engine: queues, and a hook its worker thread calls after each decode."""

    n_active = 3
    n_waiting = 1

    def __init__(self) -> None:
        self.on_step: Callable[[int], None] | None = None


def test_an_engine_without_queues_or_steps_is_left_out() -> None:
    m = Metrics()
    m.attach("gw", object())
    names = {name for name, labels in samples(m) if ("model_name", "gw") in labels}
    assert names == set()


def test_steps_from_another_thread_and_queues_read_at_scrape_time() -> None:
    m = Metrics()
    engine = _Stepping()
    m.attach("m", engine)
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


def test_a_clock_times_the_first_token_then_the_gaps() -> None:
    m = Metrics()
    clock = m.timer("m").clock()
    for _ in range(4):
        clock.token()
    got = samples(m)
    label = (("model_name", "m"),)
    assert got[("tokenwire_time_to_first_token_seconds_count", label)] == 1
    assert got[("tokenwire_inter_token_latency_seconds_count", label)] == 3

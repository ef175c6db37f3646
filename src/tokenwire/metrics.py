"""What tokenwire counts, for `GET /metrics` in Prometheus' text format.

One `Metrics` per app, on its own `CollectorRegistry` (never prometheus_client's process-wide
default), so several apps in one process (tests, embedders) neither share nor collide. Names
are vLLM's with `tokenwire_` for `vllm:` where one means the same, so dashboards carry over.

Each event is one method, called by the layer that sees it: the HTTP layer (requests by route
and status), serving (usage, token timing), the embedded engine's worker thread (tokens per
decode). That thread is not the event loop; prometheus_client's metrics lock, so observing
from it is safe. A new metric is one attribute in `__init__` and one method here. One family
is not the app's own: tokenizer conversions are counted process-wide (tokenizers are shared)
and read at each scrape.

Under `--workers` (api/worker.py) the workers count into prometheus_client's multiprocess
files and a scrape at any worker reads them all; values read from an engine at each scrape
(queue gauges, conversions) are written to the files instead, by each worker once a second
(`refresh`) and by the scraped one at the scrape.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from .protocol.common import Usage
from .tokenizers.conversions import conversions

if TYPE_CHECKING:
    from .engines.base import Engine

__all__ = ["CONTENT_TYPE", "SHARED_DIR_ENV", "UNMATCHED", "Metrics", "PromptKind", "TokenClock",
           "TokenTimer"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The media type of `Metrics.render()`'s bytes."""
UNMATCHED = "unmatched"
"""The route label of a request no route matches (one series, whatever the path)."""

PromptKind = Literal["tokens", "text"]
"""How a generation request's prompt arrived: with token ids the client sent, or text only."""

# CPU serving: a decode step takes milliseconds to a second, a long prefill tens of seconds
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5,
               1.0, 2.5, 5.0, 10.0, 20.0)
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
STEP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class _Tally:
    """Observations of one histogram child counted here and added to it in one go: an
    observation is then a bisect and two additions (a `Histogram.observe` costs 2 us, 7 us in
    the multiprocess mode of `--workers`, which writes a memory map per call)."""

    __slots__ = ("_bounds", "_child", "_counts", "_n", "_sum")

    def __init__(self, child: Histogram):
        self._child = child
        self._bounds = child._upper_bounds  # the child's own, +Inf last
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._n = 0

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1  # first bound >= value, as observe
        self._sum += value
        self._n += 1
        if self._n >= 64:
            self.flush()

    def flush(self) -> None:
        if not self._n:
            return
        buckets = self._child._buckets
        for i, n in enumerate(self._counts):
            if n:
                buckets[i].inc(n)
                self._counts[i] = 0
        self._child._sum.inc(self._sum)
        self._sum, self._n = 0.0, 0


class TokenClock:
    """Times one choice, started when it was submitted: its first sampled token against the
    start (time to first token), each later one against the one before (inter-token; tallied,
    added every 64 tokens and at `close`)."""

    def __init__(self, ttft: Histogram, itl: Histogram | None):
        self._ttft = ttft
        self._itl = _Tally(itl) if itl is not None else None
        self._last: float | None = None
        self._start = time.monotonic()

    def token(self) -> None:
        """One token sampled (the end-of-generation token counts, as in `usage`)."""
        now = time.monotonic()
        if self._last is None:
            self._ttft.observe(now - self._start)
        elif self._itl is not None:
            self._itl.observe(now - self._last)
        self._last = now

    def close(self) -> None:
        """The choice ended: what is tallied goes to the histogram."""
        if self._itl is not None:
            self._itl.flush()


class TokenTimer:
    """One model's latency histograms; `clock()` starts a `TokenClock` for one choice."""

    def __init__(self, ttft: Histogram, itl: Histogram):
        self._ttft = ttft
        self._itl = itl

    def clock(self, *, inter_token: bool = True) -> TokenClock:
        """`inter_token` False: the tokens arrive together (a whole answer), only the first is
        timed."""
        return TokenClock(self._ttft, self._itl if inter_token else None)


class _Conversions(Collector):
    """The process-wide tokenizer conversion counts (tokenizers/conversions.py), read at each
    scrape: tokenizers are shared by every app in the process, so each app's registry shows
    the same counts."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "tokenwire_tokenizer_conversions", "Text <-> ids conversions the server performed "
            "(encode: text to ids; decode: ids to text or bytes), by the reason they were "
            "needed; the token-native path needs none.", labels=["direction", "reason"])
        for (direction, reason), n in sorted(conversions().items()):
            family.add_metric([direction, reason], n)
        yield family


SHARED_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's multiprocess directory (it reads the variable at import)."""


def _shared_dir() -> str | None:
    """The multiprocess directory of `--workers`; None: this process alone."""
    return os.environ.get(SHARED_DIR_ENV) or None


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self._shared = _shared_dir()
        self._pulled: list[tuple[Gauge, Callable[[], float]]] = []
        """(gauge, its reading): set at each refresh when shared"""
        self._converted: dict[tuple[str, str], int] = {}
        """the conversion counts already added to the shared counter"""
        model = ["model_name"]
        self._requests = Counter(
            "tokenwire_http_requests", "HTTP requests answered, by route template and status.",
            ["route", "status"], registry=reg)
        self._served = Counter(
            "tokenwire_generation_requests", "Generation requests that reached the engine, by "
            "how the prompt arrived: with client token ids (tokens) or as text only (text).",
            [*model, "prompt"], registry=reg)
        self._prompt_tokens = Counter(
            "tokenwire_prompt_tokens", "Prompt tokens of the requests served (their usage).",
            model, registry=reg)
        self._generation_tokens = Counter(
            "tokenwire_generation_tokens", "Tokens sampled for the requests served (their "
            "usage's completion_tokens).", model, registry=reg)
        self._cached_tokens = Counter(
            "tokenwire_prompt_tokens_cached", "Prompt tokens the engine's prefix cache served "
            "(usage's cached_tokens, where the engine reports it).", model, registry=reg)
        # an engine's reading is its box's (a gateway's load is on the shared board): the
        # latest worker's reading is the value, never a sum over workers
        self._running = Gauge(
            "tokenwire_num_requests_running", "Sequences running on the engine now.", model,
            registry=reg, multiprocess_mode="livemostrecent")
        self._waiting = Gauge(
            "tokenwire_num_requests_waiting", "Sequences admitted and waiting for a slot.",
            model, registry=reg, multiprocess_mode="livemostrecent")
        self._restarts = Gauge(
            "tokenwire_engine_restarts", "Times the embedded engine's process was started "
            "again after it died (SIGSEGV, SIGKILL, the OOM killer), since the server started.",
            model, registry=reg, multiprocess_mode="livemostrecent")
        self._steps = Histogram(
            "tokenwire_iteration_tokens_total", "Tokens per engine step (per llama_decode).",
            model, buckets=STEP_BUCKETS, registry=reg)
        self._ttft = Histogram(
            "tokenwire_time_to_first_token_seconds", "From a choice's submission to its first "
            "sampled token, in seconds.", model, buckets=TTFT_BUCKETS, registry=reg)
        self._itl = Histogram(
            "tokenwire_inter_token_latency_seconds", "Between consecutive sampled tokens of a "
            "choice, in seconds.", model, buckets=ITL_BUCKETS, registry=reg)
        self._loop_lag = Histogram(
            "tokenwire_event_loop_lag_seconds", "How late the server's event loop came back to "
            "a timer due every 100 ms: its ready work queued ahead (a callback that blocks, or "
            "many at once), in seconds.", buckets=LAG_BUCKETS, registry=reg)
        self.in_flight = 0
        """HTTP requests being answered now (this process)."""
        self.answered = 0
        """HTTP requests answered since the start (this process)."""
        self._migrations = Counter(
            "tokenwire_upstream_migrations", "Sequences whose upstream replica was lost "
            "mid-response, by outcome: moved (continued on another replica) or gave_up.",
            [*model, "outcome"], registry=reg)
        if self._shared is None:
            reg.register(_Conversions())
        else:
            self._conversions = Counter(
                "tokenwire_tokenizer_conversions", "Text <-> ids conversions the server "
                "performed (encode: text to ids; decode: ids to text or bytes), by the reason "
                "they were needed; the token-native path needs none.",
                ["direction", "reason"], registry=reg)

    def attach(self, model: str, engine: Engine) -> None:
        """Watch a served model's engine: its queues (and the embedded engine's restarts) are
        read at each scrape; it reports each decode step and each moved sequence."""
        readings: list[tuple[Gauge, Callable[[], float]]] = [
            (self._running, lambda: engine.n_active), (self._waiting, lambda: engine.n_waiting)]
        if engine.restarts is not None:  # an engine with a process of its own
            readings.append((self._restarts, lambda: engine.restarts or 0))
        for gauge, read in readings:
            if self._shared is None:
                gauge.labels(model).set_function(read)
            else:
                self._pulled.append((gauge.labels(model), read))
        steps = self._steps
        # the series appears with the first step: an engine that never steps has none
        engine.on_step = lambda n: steps.labels(model).observe(n)
        engine.on_migration = lambda outcome: self._migrations.labels(model, outcome).inc()

    def request(self, route: str, status: int) -> None:
        self._requests.labels(route, str(status)).inc()

    def loop_lag(self, seconds: float) -> None:
        self._loop_lag.observe(seconds)

    def served(self, model: str, prompt: PromptKind, usage: Usage) -> None:
        """A generation request's usage, counted once (also a stream cut short)."""
        self._served.labels(model, prompt).inc()
        self._prompt_tokens.labels(model).inc(usage.prompt_tokens)
        self._generation_tokens.labels(model).inc(usage.completion_tokens)
        details = usage.prompt_tokens_details
        if details is not None:  # the engine reports its cache (absent series: it does not)
            self._cached_tokens.labels(model).inc(details.cached_tokens)

    def timer(self, model: str) -> TokenTimer:
        return TokenTimer(self._ttft.labels(model), self._itl.labels(model))

    @property
    def shared(self) -> bool:
        """Counted with the other workers of `--workers` (then `refresh` once a second)."""
        return self._shared is not None

    def refresh(self) -> None:
        """Shared: write this worker's readings to the multiprocess files."""
        for gauge, read in self._pulled:
            gauge.set(read())
        for key, n in conversions().items():
            added = n - self._converted.get(key, 0)
            if added > 0:
                self._conversions.labels(*key).inc(added)
                self._converted[key] = n

    def close(self) -> None:
        """Shared: this worker's live gauges leave the scrape."""
        if self._shared is not None:
            mark_process_dead(os.getpid(), self._shared)  # type: ignore[no-untyped-call]

    def render(self) -> bytes:
        if self._shared is None:
            return generate_latest(self.registry)
        self.refresh()
        every = CollectorRegistry()
        MultiProcessCollector(every, self._shared)  # type: ignore[no-untyped-call]
        return generate_latest(every)

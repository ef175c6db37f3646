"""Health checks and verification of an engine's replicas.

A background task per replica checks it; a replica that fails a request is marked down at once
(`Replica.down`, by admission or the stream) and comes back when its health check passes. A
replica not verified yet (new, or back from down: it may come back as another model) is verified
before use: the model it serves and its context length (the protocol module's `describe`), and
its tokenizer against the pinned one on the probe corpus (its `tokenize`). A replica that serves
another model or tokenizer is refused: at start that refuses to start, naming the difference;
later the replica is kept out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Protocol

import aiohttp

from ...tokenizers.probe import TokenizerParityError, first_mismatch
from ..base import EngineStartError
from ..spec import EngineSpec
from .fleet import FleetControl
from .replica import Replica, UpstreamInfo
from .transport import MALFORMED, TRANSPORT_ERRORS, UpstreamStatusError

__all__ = ["VERIFY_TIMEOUT", "Health"]

VERIFY_TIMEOUT = 120.0
"""Seconds one replica's verification (model, context, the tokenizer probe) may take."""

log = logging.getLogger(__name__)


class _Owner(Protocol):
    """What the health checks need of the engine (engine.py's `UpstreamEngine`, which imports
    this module)."""

    @property
    def name(self) -> str: ...
    @property
    def health_path(self) -> str: ...
    @property
    def replicas(self) -> list[Replica]: ...
    @property
    def fleet(self) -> FleetControl: ...
    @property
    def http(self) -> aiohttp.ClientSession: ...
    async def describe(self, replica: Replica) -> UpstreamInfo: ...
    async def tokenize(self, replica: Replica, texts: Sequence[str]) -> list[list[int]] | None: ...


class Health:
    """The checks of one engine's replicas, and the model name their verification settles."""

    def __init__(self, engine: _Owner, spec: EngineSpec):
        self._engine = engine
        self._spec = spec
        self._settings = spec.settings
        self._watchers: list[asyncio.Task[None]] = []
        self.model: str | None = spec.settings.upstream_model
        """The model name the upstream serves (sent in requests that need one): the operator's,
        else the first verified replica's."""

    def watch(self) -> None:
        """Start the background checks, one task per replica."""
        name = self._engine.name
        self._watchers = [asyncio.create_task(self._watch(r), name=f"{name}-{r.name}")
                          for r in self._engine.replicas]

    async def stop(self) -> None:
        for task in self._watchers:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._watchers, return_exceptions=True)
        self._watchers = []

    async def _watch(self, r: Replica) -> None:
        """One replica's checks: a slow one never holds back the others'."""
        while True:
            await asyncio.sleep(self._settings.health_interval)
            try:
                await self.check(r)
            except Exception as exc:  # noqa: BLE001 - the watcher must outlive any answer
                r.down(f"health check failed: {exc!r}")
            self._engine.fleet.place()  # a version met for the first time takes its place

    async def check(self, r: Replica, *, starting: bool = False) -> None:
        """Health-check one replica; a replica not verified yet is verified before use. While
        `starting`, a replica refused raises (the engine refuses to serve)."""
        if r.refused is not None:
            return
        timeout = aiohttp.ClientTimeout(total=min(5.0, self._settings.upstream_connect_timeout))
        try:
            async with self._engine.http.get(r.url + self._engine.health_path,
                                             timeout=timeout) as resp:
                await resp.read()
                status = resp.status
        except TRANSPORT_ERRORS as exc:
            r.down(f"health check failed: {exc!r}")
            return
        if status != 200:
            r.down(f"health check answered {status}")
            return
        if r.info is None:
            try:
                await asyncio.wait_for(self._verify(r), VERIFY_TIMEOUT)
            except (*TRANSPORT_ERRORS, UpstreamStatusError, *MALFORMED) as exc:
                r.down(f"could not be verified: {exc!r}")
                return
            except (TokenizerParityError, EngineStartError) as exc:
                r.refused = str(exc)
                r.down(r.refused)
                if starting:
                    raise  # at start: refuse to serve
                log.error("upstream %s is not used: %s", r.url, exc)
                return
        if not r.healthy:
            why = await self._engine.fleet.join(r)  # paused, or other weights than the fleet's
            if why is not None:
                r.reason = why
                return
            log.info("upstream %s is up", r.url)
        r.up()
        try:  # its weights' version and pause state, as it reports them (routing reads them)
            await self._engine.fleet.observe(r)
        except (*TRANSPORT_ERRORS, *MALFORMED, UpstreamStatusError, TimeoutError) as exc:
            log.debug("upstream %s: its state could not be read: %r", r.url, exc)

    async def _verify(self, r: Replica) -> None:
        info = await self._engine.describe(r)
        first = next((x.info for x in self._engine.replicas if x.info is not None), None)
        if first is not None and (info.model, info.max_model_len) != (first.model,
                                                                       first.max_model_len):
            raise EngineStartError(  # kept out, as a replica with another tokenizer is
                f"upstream {r.url} serves {info.model!r} with {info.max_model_len} tokens per "
                f"sequence; the others serve {first.model!r} with {first.max_model_len}")
        pinned = self.model
        self.model = pinned or info.model  # the name the probe's requests carry
        try:
            await self._probe_tokenizer(r)
        except BaseException:
            self.model = pinned  # not from a replica that is refused or failed
            raise
        r.info = info
        log.info("upstream %s verified: model %r, %d tokens per sequence%s", r.url, info.model,
                 info.max_model_len, f", {info.mode}" if info.mode else "")

    async def _probe_tokenizer(self, r: Replica) -> None:
        if self._settings.check_upstream_tokenizer:
            tok = self._spec.source.tokenizer

            async def reference(texts: Sequence[str]) -> list[list[int]]:
                got = await self._engine.tokenize(r, texts)
                if got is None:
                    log.warning("upstream %s cannot tokenize: its tokenizer is taken on trust",
                                r.url)
                    return [tok.encode(t, parse_special=True) for t in texts]
                return got

            miss = await first_mismatch(tok, reference)
            if miss is not None:
                raise TokenizerParityError(miss.describe(f"upstream {r.url}"))

"""`UpstreamEngine`: the `Engine` over upstream replicas, and what a protocol module fills in.

A protocol module (vllm.py, sglang.py, llama_server.py, openai.py) subclasses it and says only
how its server spells things, in five methods: `describe`, `tokenize`, `request`, `decoder` and
`protocol_error` (the last has a default). It may extend `engine_info` and set `name` and
`health_path`; for its own round trips it has `call`, `get_json`, `tokenize_each` and
`model_card`, and `model_name` for the bodies it builds.

The engine itself starts (a first verified replica, one model on all of them), reports health
without a round trip, and admits a request with fail-over: it tries the replicas in the router's
order; a connection failure, a 5xx, a 429 or a stream that ends before its first event moves on
to the next replica. Nothing has reached the client yet, so fail-over is safe; after the first
event it never happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from ...config import Settings, default_model_name
from ...errors import (
    RateLimitError,
    ServiceUnavailableError,
    TokenwireError,
    UnsupportedParameterError,
)
from ..base import (
    ControlAnswer,
    ControlCall,
    EngineBase,
    EngineHealth,
    EngineInfo,
    EngineStartError,
    SamplingParams,
    check_prompt,
)
from ..grammars.upstream import client_param
from ..spec import EngineSpec
from .board import Board
from .error_body import upstream_error
from .fleet import FleetControl
from .health import Health
from .migration import MigratingStream
from .replica import Replica, Seat, UpstreamInfo
from .routing import PrefixRouter
from .stream import ChunkDecoder, UpstreamStream
from .transport import TRANSPORT_ERRORS, Transport, json_or_error

__all__ = ["UpstreamEngine"]

log = logging.getLogger(__name__)


class _Failover(Exception):
    """This replica cannot take the request now; the next one may."""

    def __init__(self, reason: str, *, rate_limited: bool = False):
        super().__init__(reason)
        self.rate_limited = rate_limited


class UpstreamEngine(EngineBase):
    """Implements `Engine` over HTTP servers; subclasses say how their server spells things."""

    name = "upstream"
    health_path = "/health"

    def __init__(self, spec: EngineSpec):
        s = spec.settings
        self._spec = spec
        self._settings = s
        urls = [u.rstrip("/") for u in s.upstream]
        # what this engine's workers share (board.py): keyed by what the engine serves from
        self.board = Board([self.name, *urls], len(urls), s.max_workers)
        self._replicas = [Replica(u, f"replica {i + 1}", i, self.board)
                          for i, u in enumerate(urls)]
        self._router = PrefixRouter(len(self._replicas), block=s.route_block_tokens,
                                    lead=s.route_prefix_tokens)
        self._info: EngineInfo | None = None
        self._transport = Transport()
        self._health = Health(self, spec)
        self.fleet = FleetControl(self)
        self.on_migration: Callable[[str], None] | None = None
        """Told "moved" or "gave_up" for each lost sequence (metrics.py counts them)."""

    @property
    def settings(self) -> Settings:
        return self._settings

    # -- what a protocol module provides -----------------------------------------------------

    async def describe(self, replica: Replica) -> UpstreamInfo:
        """The model a replica serves and its context length (round trips allowed)."""
        raise NotImplementedError

    async def tokenize(self, replica: Replica, texts: Sequence[str]) -> list[list[int]] | None:
        """The replica's own ids for `texts`, control-token strings parsed; None if it cannot
        tokenize (then the tokenizer is taken on trust, and the logs say so)."""
        raise NotImplementedError

    def request(self, replica: Replica, prompt: Sequence[int],
                params: SamplingParams) -> tuple[str, dict[str, Any]]:
        """The path and JSON body that stream a continuation of `prompt`."""
        raise NotImplementedError

    def decoder(self, replica: Replica, prompt: Sequence[int],
                params: SamplingParams) -> ChunkDecoder:
        """A fresh decoder for one response of `replica` to `request(...)`."""
        raise NotImplementedError

    def control_request(self, call: ControlCall) -> tuple[str, str, Any]:
        """The method, path and JSON body that make a replica do `call` (fleet.py); an
        engine without a control plane refuses by name (the default)."""
        raise UnsupportedParameterError(
            f"the {self.name} engine has no control plane: {call.op} cannot reach its "
            "replicas (vLLM's RL endpoints are served in front of vLLM upstreams)",
            param=call.op)

    def control_answer(self, call: ControlCall, status: int, body: Any) -> tuple[int, Any]:
        """A replica's answer to `control_request(call)`, as vLLM answers `call` (status,
        body); the default: as it came."""
        return status, body

    async def control(self, call: ControlCall) -> list[ControlAnswer]:
        """`call` on every replica (fleet.py)."""
        return await self.fleet.call(call)

    async def adapters_of(self, replica: Replica) -> dict[str, str] | None:
        """The LoRA adapters a replica serves (name: path); None: the protocol has none."""
        return None

    def cache_salt(self, replica: Replica, params: SamplingParams) -> str | None:
        """The salt a request's prefix cache is keyed by upstream: the client's, and for an
        adapter its name and version (vLLM keys an adapter's cached blocks by its name and path
        only: an adapter replaced in place would reuse KV of its old weights)."""
        if params.adapter is None:
            return params.cache_salt
        _, version = replica.adapters.get(params.adapter, ("", ""))
        key = json.dumps([params.cache_salt, params.adapter, version])
        return hashlib.sha256(key.encode()).hexdigest()

    def adapters(self) -> dict[str, str]:
        """The adapters some healthy replica serves: name -> path."""
        return {name: path for r in self._replicas if r.healthy
                for name, (path, _) in r.adapters.items()}

    def protocol_error(self, status: int, body: Any, where: str) -> TokenwireError:
        """An error body (a 4xx, or an in-band error in a stream) from replica `where`, in our
        tree."""
        return upstream_error(status, body, where)

    # -- helpers for protocol modules --------------------------------------------------------

    @property
    def http(self) -> aiohttp.ClientSession:
        return self._transport.session

    @property
    def model_name(self) -> str | None:
        """The model name the upstream serves (sent in requests that need one): the operator's,
        else the one verification settled (health.py)."""
        return self._health.model

    async def send(self, method: str, url: str, **kw: Any) -> aiohttp.ClientResponse:
        return await self._transport.send(method, url, **kw)

    async def call(self, replica: Replica, method: str, path: str, body: Any = None,
                   ) -> tuple[int, Any]:
        """One request with a JSON answer: (status, the parsed body, or None)."""
        return await self._transport.call(replica, method, path, body)

    async def get_json(self, replica: Replica, path: str) -> Any:
        return await self._transport.get_json(replica, path)

    async def tokenize_each(self, replica: Replica, texts: Sequence[str], path: str,
                            body: Callable[[str], dict[str, Any]]) -> list[list[int]] | None:
        """`texts` through the replica's tokenize endpoint, one request each (a few at a
        time); None when it has none (404, 405, 501)."""
        return await self._transport.tokenize_each(replica, texts, path, body)

    async def model_card(self, replica: Replica) -> dict[str, Any]:
        """The replica's `/v1/models` card of the model we serve (its first, until we know)."""
        cards = (await self.get_json(replica, "/v1/models") or {}).get("data") or []
        card = next((c for c in cards if c.get("id") == self.model_name), None)
        if card is None and self.model_name is None and cards:
            card = cards[0]
        if not isinstance(card, dict):
            raise ValueError(f"it does not serve {self.model_name!r}")
        return card

    # -- Engine -------------------------------------------------------------------------------

    @property
    def info(self) -> EngineInfo:
        if self._info is None:
            raise ServiceUnavailableError("the engine has not been started")
        return self._info

    @property
    def replicas(self) -> list[Replica]:
        return self._replicas

    @property
    def n_active(self) -> int:
        return sum(r.in_flight for r in self._replicas)

    @property
    def n_waiting(self) -> int:
        return 0  # the upstreams queue; we hold nothing back

    def health(self) -> EngineHealth:
        reps = tuple(r.snapshot() for r in self._replicas)
        ok = any(r.healthy for r in self._replicas)
        reason = None if ok else "no upstream replica can serve: " + "; ".join(
            f"{r.name} ({r.url}): {r.reason}" for r in reps)
        return EngineHealth(ok=ok, reason=reason, replicas=reps)

    def engine_info(self, first: UpstreamInfo) -> EngineInfo:
        """The engine's info once a first replica is verified (subclasses may add to it)."""
        tok = self._spec.source.tokenizer
        model = first.model
        if model.endswith(".gguf"):  # llama-server names its model by the file's path
            model = default_model_name(Path(model))
        cap = self._settings.max_model_len  # the operator's, at most what the upstream holds
        return EngineInfo(model=self._settings.served_model_name or model,
                          max_model_len=min(first.max_model_len, cap or first.max_model_len),
                          vocab_size=tok.vocab_size, eog_ids=self._spec.eog_ids,
                          logprobs_mode=self.logprobs_mode, control_plane=True)

    @property
    def logprobs_mode(self) -> str | None:
        """What the upstream's logprobs are, where the protocol knows (None: unknown)."""
        return None

    async def start(self) -> None:
        """Wait for a first replica to be verified (the others may come later), learn the
        model and context length from it, and start the background health checks. A replica
        with another model, context length or tokenizer refuses the start."""
        if self._transport.is_open:
            return
        s = self._settings
        self._transport.open(s)
        starting = self._info is None  # a first start refuses to serve beside a refused replica
        deadline = time.monotonic() + s.upstream_start_timeout
        while True:
            outcomes = await asyncio.gather(
                *(self._health.check(r, starting=starting) for r in self._replicas),
                return_exceptions=True)
            for outcome in outcomes:  # a replica refused (another tokenizer or model)
                if isinstance(outcome, BaseException):
                    raise outcome
            verified = [r for r in self._replicas if r.info is not None]
            if verified:
                break
            if time.monotonic() >= deadline:
                reasons = "; ".join(f"{r.url}: {r.reason}" for r in self._replicas)
                raise EngineStartError(f"no {self.name} upstream answered within "
                                       f"{s.upstream_start_timeout:g} s ({reasons})")
            await asyncio.sleep(min(1.0, s.health_interval))
        served = {(r.info.model, r.info.max_model_len) for r in verified if r.info is not None}
        if len(served) > 1:
            raise EngineStartError("the upstream replicas serve different models: " + "; ".join(
                f"{r.url}: {r.info.model!r}, {r.info.max_model_len} tokens per sequence"
                for r in verified if r.info is not None))
        self._info = self.engine_info(verified[0].info)  # type: ignore[arg-type]
        self.fleet.place()  # the versions met at start, placed together
        self._health.watch()

    async def aclose(self) -> None:
        await self._health.stop()
        await self._transport.close()
        self.board.close()

    # -- admission ----------------------------------------------------------------------------

    async def submit(self, prompt: Sequence[int], params: SamplingParams) -> MigratingStream:
        """Admission; the sequence moves to another replica if its own is lost mid-response
        (migration.py)."""
        return MigratingStream(self, prompt, params, await self.admit(prompt, params))

    def hold(self, replicas: Sequence[str], held: bool) -> None:
        """Keep replicas out of routing (every worker of the box), or not."""
        for r in self._replicas:
            if r.name in replicas:
                self.board.hold(r.index, held)

    def held(self) -> frozenset[str]:
        return frozenset(r.name for r in self._replicas if r.held)

    @property
    def paused(self) -> str | None:
        return self.fleet.paused

    def _usable(self, params: SamplingParams) -> list[bool]:
        """The replicas a request may go to: healthy, within its weight bound, and not paused
        or held by a rolling update (unless every such one is: they queue it until they
        resume, as a paused fleet does)."""
        reps = self._replicas
        ok = [r.healthy for r in reps]
        name = params.adapter
        if name is not None:  # where it is loaded; a bound is on its versions
            ok = [a and name in r.adapters for a, r in zip(ok, reps, strict=True)]
        bound = params.weight_bound
        if bound is not None:
            if self.fleet.reports_versions is False:
                raise UnsupportedParameterError(
                    f"the {self.name} upstreams report no weight versions: "
                    f"{bound.describe()} cannot be honoured", param=bound.param)
            versions = [r.weight_version for r in reps] if name is None else \
                [r.adapters[name][1] if name in r.adapters else None for r in reps]
            # the newest is the newest a replica that can serve now holds
            serving = [r.healthy and not r.held for r in reps]
            within = self.fleet.order_of(name).admits(bound, versions, serving)
            ok = [a and b for a, b in zip(ok, within, strict=True)]
        free = [a and not (r.paused or r.held) for a, r in zip(ok, reps, strict=True)]
        return free if any(free) else ok

    async def _within_bound(self, params: SamplingParams) -> list[bool]:
        """Wait (up to the bound's wait) for a replica within the request's weight bound."""
        usable = self._usable(params)
        bound = params.weight_bound
        if bound is None or any(usable) or not any(r.healthy for r in self._replicas):
            return usable
        deadline = time.monotonic() + bound.wait
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(0.25, left))
            with contextlib.suppress(TimeoutError):  # the replicas' own word, in time
                await asyncio.wait_for(self.fleet.refresh(), max(0.0, deadline -
                                                                 time.monotonic()))
            usable = self._usable(params)
            if any(usable):
                return usable
        name = params.adapter
        raise self.fleet.order_of(name).unavailable(bound, [
            (r.name, r.weight_version if name is None else r.adapters.get(name, ("", None))[1],
             "paused" if r.paused or r.held else "serving" if r.healthy else "down")
            for r in self._replicas])

    async def admit(self, prompt: Sequence[int], params: SamplingParams) -> UpstreamStream:
        """One admission: the replicas in the router's order, with fail-over."""
        check_prompt(prompt, self.info)
        reps = self._replicas
        salt = params.cache_salt if params.adapter is None else \
            f"{params.cache_salt or ''}\0{params.adapter}"  # an adapter's prefixes are its own
        order = self._router.order(prompt, await self._within_bound(params),
                                   [r.in_flight for r in reps], salt=salt,
                                   cache_key=params.cache_key)
        failures: list[_Failover] = []
        for i in order:
            r = reps[i]
            try:
                stream = await self._open(r, prompt, params)
            except _Failover as exc:
                failures.append(exc)
                continue
            self._router.record(prompt, i, salt=salt, cache_key=params.cache_key)
            self.board.count_served(i)
            return stream
        if failures and all(f.rate_limited for f in failures):
            raise RateLimitError("every upstream replica is at capacity: " +
                                 "; ".join(str(f) for f in failures))
        why = "; ".join(str(f) for f in failures) or "none is up"
        raise ServiceUnavailableError(f"no upstream replica can serve this request: {why}")

    async def _open(self, r: Replica, prompt: Sequence[int],
                    params: SamplingParams) -> UpstreamStream:
        path, body = self.request(r, prompt, params)
        # a whole response comes when it is done: no read timeout can tell a slow one
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._settings.
                                        upstream_connect_timeout, sock_read=None) \
            if body.get("stream") is False else None
        seat = r.seat()  # in flight from the send (a whole answer's headers come last)
        try:
            return await self._opened(r, prompt, params, path, body, timeout, seat)
        except BaseException:
            seat.release()
            raise

    async def _opened(self, r: Replica, prompt: Sequence[int], params: SamplingParams,
                      path: str, body: dict[str, Any], timeout: aiohttp.ClientTimeout | None,
                      seat: Seat) -> UpstreamStream:
        try:
            resp = await self.send("POST", r.url + path, json=body, timeout=timeout)
        except TRANSPORT_ERRORS as exc:
            r.down(f"request failed: {exc!r}")
            raise _Failover(f"{r.name}: unreachable") from exc
        if resp.status != 200:
            try:
                data = await resp.read()
            except TRANSPORT_ERRORS:
                data = b""
            finally:
                resp.release()
            status = resp.status
            if status in (429, 503):  # busy (vLLM's admission control sends 503): try another
                why = str(self.protocol_error(status, json_or_error(data), r.name))
                raise _Failover(why, rate_limited=status == 429)
            if status in (401, 403, 404):  # misconfigured for us: out until checked again
                r.down(f"answered {status}: {data[:200]!r}")
                raise _Failover(f"{r.name}: answered {status}")
            if status >= 500:  # this request failed there; the replica may serve others
                log.warning("upstream %s answered %d: %r", r.url, status, data[:200])
                raise _Failover(f"{r.name}: answered {status}")
            err = self.protocol_error(status, json_or_error(data), r.name)
            if params.grammar is not None and err.param:  # the schema's keyword, as sent
                err.param = client_param(err.param, params.grammar)
            raise err
        stream = UpstreamStream(self, r, resp, self.decoder(r, prompt, params), seat)
        try:  # a replica that accepted the request but cannot serve it still fails over
            await stream.prime()
        except (ServiceUnavailableError, RateLimitError) as exc:
            raise _Failover(str(exc), rate_limited=isinstance(exc, RateLimitError)) from exc
        return stream

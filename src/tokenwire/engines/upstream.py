"""What every upstream engine shares: replicas, health, routing, admission with fail-over, and
reading a streamed response into engine events.

An upstream engine is a transport to one or more HTTP servers that run the model (vLLM,
SGLang, llama-server, an OpenAI-compatible text server). Its module says only how that server
spells a request, a chunk and an error (`UpstreamProtocol`); this module does the rest:

- start: wait for a first replica, learn its model and context length, check its tokenizer
  against the pinned one on the probe corpus (a mismatch refuses to start, naming the string);
- admission: try the replicas in the router's order; a connection failure, a 5xx, a 429 or a
  stream that ends before its first event moves on to the next replica. Nothing has reached the
  client yet, so fail-over is safe; after the first event it never happens;
- streaming: upstreams are always asked to stream, so a closed client closes the upstream
  response (the upstream aborts the request) and one code path serves both response kinds;
- health: a background task checks every replica; a replica that fails a request is marked
  down at once and comes back when its health check passes (a new replica is verified first).

Transport errors become `ServiceUnavailableError` here, at the boundary (`raise ... from`).
The transport is aiohttp: one event per sampled token makes per-read cost the gateway's cost,
and aiohttp's C parser reads an event in about half the CPU httpx's pure-Python stack takes
(measured on loopback in bench/gateway.py's setting; docs/engines.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from ..config import default_model_name
from ..errors import (
    KNOWN_CODES,
    InvalidRequestError,
    RateLimitError,
    ServiceUnavailableError,
    TokenwireError,
    UnsupportedParameterError,
    error_from_body,
)
from ..tokenizers.probe import TokenizerParityError, first_mismatch
from .base import (
    EngineEvent,
    EngineHealth,
    EngineInfo,
    EngineStartError,
    FinishEvent,
    Grammar,
    ReplicaHealth,
    ReplicaLostError,
    SamplingParams,
    TokenEvent,
    check_prompt,
)
from .registry import EngineSpec
from .routing import PrefixRouter

__all__ = ["ChunkDecoder", "Replica", "UpstreamEngine", "UpstreamInfo", "UpstreamStatusError",
           "structural_tag", "upstream_error"]

TRANSPORT_ERRORS = (aiohttp.ClientError, aiohttp.http_exceptions.HttpProcessingError,
                    asyncio.TimeoutError, ConnectionError)
"""What a request to an upstream raises when the upstream is not there to answer (or sends
what HTTP cannot parse)."""
MALFORMED = (KeyError, TypeError, AttributeError, ValueError, IndexError)
"""What a decoder raises on a chunk that is not the upstream's documented shape."""
_ABSENT = frozenset({404, 405, 501})
"""Statuses that mean "no such endpoint here" (rather than "failed this time")."""
VERIFY_TIMEOUT = 120.0
"""Seconds one replica's verification (model, context, the tokenizer probe) may take."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpstreamInfo:
    """What a replica says about the model it serves."""

    model: str
    max_model_len: int
    mode: str = ""
    """Engine-specific: which of its APIs this replica speaks (e.g. vLLM's generate or
    completions)."""


@dataclass(eq=False)
class Replica:
    url: str
    name: str
    """How clients hear of it ("replica 2"): error messages do not show internal addresses."""
    healthy: bool = False
    reason: str | None = "not checked yet"
    info: UpstreamInfo | None = None
    """Set once the replica is verified (model, context, tokenizer)."""
    refused: str | None = None
    """Why this replica may never be used (it serves another model or tokenizer)."""
    in_flight: int = 0
    served: int = 0

    def down(self, reason: str) -> None:
        """Not used until a health check passes, and verified again then (it may come back
        as another model: a rolling upgrade)."""
        if self.healthy:
            log.warning("upstream %s (%s) is down: %s", self.url, self.name, reason)
        self.healthy = False
        self.reason = reason
        self.info = None

    def snapshot(self) -> ReplicaHealth:
        return ReplicaHealth(url=self.url, name=self.name, healthy=self.healthy,
                             reason=None if self.healthy else (self.refused or self.reason),
                             in_flight=self.in_flight, served=self.served)


class UpstreamStatusError(Exception):
    """A helper request (not a generation) got a status other than 200."""

    def __init__(self, status: int, url: str):
        super().__init__(f"{url} answered {status}")
        self.status = status


class _Failover(Exception):
    """This replica cannot take the request now; the next one may."""

    def __init__(self, reason: str, *, rate_limited: bool = False):
        super().__init__(reason)
        self.rate_limited = rate_limited


class ChunkDecoder:
    """Turns one response's parsed chunks into engine events (the upstream's conventions:
    where the stop id is, cumulative or incremental ids). One per stream."""

    def feed(self, chunk: dict[str, Any]) -> list[EngineEvent]:
        raise NotImplementedError

    def end(self) -> list[EngineEvent]:
        """The stream ended (`[DONE]` or EOF): a decoder that waits for a trailing usage chunk
        finishes here; none: the stream ended unfinished."""
        return []


def _json(data: bytes | str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        text = data if isinstance(data, str) else data.decode("utf-8", "replace")
        return {"error": {"message": text[:500]}}


def upstream_error(status: int, body: Any, where: str) -> TokenwireError:
    """An upstream's error body in our tree. A tokenwire upstream's code names our own class;
    otherwise the status does (for an in-band error, the numeric `code` vLLM puts in the body):
    5xx -> 503 engine_unavailable, 429 -> 429, any other -> 400 `upstream_rejected`, with the
    upstream's message and param."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        err = {"message": str(err if err is not None else body)}
    code, param = err.get("code"), err.get("param")
    message = f"upstream {where}: {err.get('message', '')}"
    if status == 200:  # in-band
        status = code if isinstance(code, int) and not isinstance(code, bool) else 500
    if code == "special_token_not_allowed":  # a tokenwire upstream refusing our raw prompts
        return ServiceUnavailableError(
            f"upstream {where} refuses this gateway's rendered prompts: allow raw prompts for "
            "it there (TOKENWIRE_RAW_PROMPT_KEYS, or TOKENWIRE_RAW_PROMPTS=allow)")
    if isinstance(code, str) and code in KNOWN_CODES:
        exc = error_from_body(status, body)
        exc.message = message
        return exc
    if status >= 500:
        return ServiceUnavailableError(message)
    if status == 429:
        return RateLimitError(message)
    return InvalidRequestError(message, param=param if isinstance(param, str) else None,
                               code="upstream_rejected")


class _Stream:
    """The events of one upstream response; closing it closes the response (the upstream
    cancels the request) and releases the replica."""

    def __init__(self, engine: UpstreamEngine, replica: Replica,
                 response: aiohttp.ClientResponse, decoder: ChunkDecoder):
        self._vocab = engine.info.vocab_size
        self._engine = engine
        self._replica = replica
        self._response = response
        # a whole JSON body instead of events (vLLM before 0.20, or scoring, which vLLM only
        # returns unstreamed): one chunk with everything
        self._whole = response.content_type == "application/json"
        self._decoder = decoder
        self._pending: deque[EngineEvent] = deque()
        self._finished = False
        self._closed = False
        replica.in_flight += 1

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> EngineEvent:
        if not self._pending:
            if self._finished or self._closed:
                raise StopAsyncIteration
            await self._fill()
        ev = self._pending.popleft()
        if isinstance(ev, FinishEvent):
            self._finished = True
            await self.aclose()
        return ev

    async def _fill(self) -> None:
        """Read until the decoder has events: raises a typed error on an in-band error, on a
        broken connection, or on a stream that ends unfinished."""
        name = self._replica.name
        content = self._response.content
        try:
            if self._whole:
                self._whole = False
                body = _json(await self._response.read())
                if not isinstance(body, dict) or "error" in body:
                    raise self._engine.protocol_error(200, body, name)
                self._take(self._decoder.feed(body))
                self._take(self._decoder.end())
                if not self._pending or not isinstance(self._pending[-1], FinishEvent):
                    raise ServiceUnavailableError(f"upstream {name} sent an unfinished response")
                return
            while not self._pending:
                line = await content.readline()
                if not line or line.startswith(b"data: [DONE]"):
                    self._take(self._decoder.end())
                    if not self._pending:
                        raise ServiceUnavailableError(
                            f"upstream {name} ended the stream before the output was finished")
                    break
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, event names
                chunk = _json(line[5:])
                if not isinstance(chunk, dict):
                    raise ServiceUnavailableError(f"upstream {name} sent a malformed chunk")
                if "error" in chunk:
                    raise self._engine.protocol_error(200, chunk, name)
                self._take(self._decoder.feed(chunk))
        except TRANSPORT_ERRORS as exc:
            self._replica.down(f"the connection broke mid-stream: {exc!r}")
            await self.aclose()
            raise ReplicaLostError(
                f"upstream {name} went away in the middle of the response") from exc
        except MALFORMED as exc:
            log.warning("upstream %s sent a chunk of another shape: %r", self._replica.url, exc)
            await self.aclose()
            raise ServiceUnavailableError(f"upstream {name} sent a malformed response") from exc
        except BaseException:
            await self.aclose()
            raise

    def _take(self, events: list[EngineEvent]) -> None:
        """Queue decoded events; a sampled id outside the pinned vocabulary is the upstream
        serving another model (or a padded vocabulary): never passed on."""
        for ev in events:
            tok = ev if isinstance(ev, TokenEvent) else \
                ev.stop_token if isinstance(ev, FinishEvent) else None
            if tok is not None and not 0 <= tok.token_id < self._vocab:
                raise ValueError(f"sampled id {tok.token_id} is outside the vocabulary")
            self._pending.append(ev)

    async def prime(self) -> None:
        """Wait for the first event, so a replica that accepted the request but cannot serve it
        still fails over (nothing has reached the client yet)."""
        try:
            await self._fill()
        except (ServiceUnavailableError, RateLimitError) as exc:
            raise _Failover(str(exc), rate_limited=isinstance(exc, RateLimitError)) from exc

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._replica.in_flight -= 1
        if self._finished:  # what follows the finish (usage, [DONE]) is read, and the
            try:            # connection kept for the next request
                await asyncio.wait_for(self._response.read(), 1.0)
                self._response.release()
                return
            except (*TRANSPORT_ERRORS, asyncio.CancelledError):
                pass
        self._response.close()  # mid-stream: closing it is how the upstream learns


class UpstreamEngine:
    """Implements `Engine` over HTTP servers; subclasses say how their server spells things."""

    name = "upstream"
    health_path = "/health"

    def __init__(self, spec: EngineSpec):
        s = spec.settings
        self._spec = spec
        self._settings = s
        self._replicas = [Replica(u.rstrip("/"), f"replica {i}")
                          for i, u in enumerate(s.upstream, start=1)]
        self._router = PrefixRouter(len(self._replicas), block=s.route_block_tokens,
                                    lead=s.route_prefix_tokens)
        self._info: EngineInfo | None = None
        self._model: str | None = s.upstream_model
        """The model name the upstream serves (sent in requests that need one)."""
        self._http: aiohttp.ClientSession | None = None
        self._watchers: list[asyncio.Task[None]] = []

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

    def protocol_error(self, status: int, body: Any, where: str) -> TokenwireError:
        """An error body (a 4xx, or an in-band error in a stream) from replica `where`, in our
        tree."""
        return upstream_error(status, body, where)

    # -- helpers for protocol modules --------------------------------------------------------

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise ServiceUnavailableError("the engine has not been started")
        return self._http

    @property
    def model_name(self) -> str | None:
        return self._model

    async def send(self, method: str, url: str, **kw: Any) -> aiohttp.ClientResponse:
        """A request; sent once more on a fresh connection when the pooled one it went out on
        turns out closed before any answer (a server's keep-alive timeout racing our reuse:
        llama-server drops idle connections after 5 s), which is not the replica failing."""
        try:
            return await self.http.request(method, url, **kw)
        except aiohttp.ServerDisconnectedError:
            return await self.http.request(method, url, **kw)

    async def call(self, replica: Replica, method: str, path: str, body: Any = None,
                   ) -> tuple[int, Any]:
        """One request with a JSON answer: (status, the parsed body, or None)."""
        async with await self.send(method, replica.url + path, json=body) as r:
            data = await r.read()
        try:
            return r.status, json.loads(data) if data else None
        except ValueError:
            return r.status, None

    async def model_card(self, replica: Replica) -> dict[str, Any]:
        """The replica's `/v1/models` card of the model we serve (its first, until we know)."""
        cards = (await self.get_json(replica, "/v1/models") or {}).get("data") or []
        card = next((c for c in cards if c.get("id") == self.model_name), None)
        if card is None and self.model_name is None and cards:
            card = cards[0]
        if not isinstance(card, dict):
            raise ValueError(f"it does not serve {self.model_name!r}")
        return card

    async def tokenize_each(self, replica: Replica, texts: Sequence[str], path: str,
                            body: Callable[[str], dict[str, Any]]) -> list[list[int]] | None:
        """`texts` through the replica's tokenize endpoint, one request each (a few at a
        time); None when it has none (404, 405, 501)."""
        slots = asyncio.Semaphore(32)

        async def one(text: str) -> list[int] | None:
            async with slots:
                status, answer = await self.call(replica, "POST", path, body(text))
            if status in _ABSENT:
                return None
            if status != 200:  # failed this time: the verification is tried again later
                raise UpstreamStatusError(status, replica.url + path)
            return list(answer["tokens"])

        got = await asyncio.gather(*(one(t) for t in texts))
        if any(g is None for g in got):
            return None
        return [g for g in got if g is not None]

    async def get_json(self, replica: Replica, path: str) -> Any:
        status, data = await self.call(replica, "GET", path)
        if status != 200:
            raise UpstreamStatusError(status, replica.url + path)
        return data

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
                          vocab_size=tok.vocab_size, eog_ids=self._spec.eog_ids)

    async def start(self) -> None:
        if self._http is not None:
            return
        s = self._settings
        headers = {"Authorization": f"Bearer {s.upstream_api_key}"} if s.upstream_api_key else {}
        self._http = aiohttp.ClientSession(
            headers=headers, raise_for_status=False,
            read_bufsize=1 << 22,  # SGLang's cumulative chunks repeat the whole output: long lines
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=s.upstream_connect_timeout,
                                          sock_read=s.upstream_read_timeout),
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0))
        deadline = time.monotonic() + s.upstream_start_timeout
        while True:
            outcomes = await asyncio.gather(*(self._check(r) for r in self._replicas),
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
        self._watchers = [asyncio.create_task(self._watch(r), name=f"{self.name}-{r.name}")
                          for r in self._replicas]

    async def aclose(self) -> None:
        for task in self._watchers:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._watchers, return_exceptions=True)
        self._watchers = []
        if self._http is not None:
            await self._http.close()
            self._http = None

    # -- health and verification --------------------------------------------------------------

    async def _watch(self, r: Replica) -> None:
        """One replica's checks: a slow one never holds back the others'."""
        while True:
            await asyncio.sleep(self._settings.health_interval)
            try:
                await self._check(r)
            except Exception as exc:  # noqa: BLE001 - the watcher must outlive any answer
                r.down(f"health check failed: {exc!r}")

    async def _check(self, r: Replica) -> None:
        """Health-check one replica; a replica not verified yet is verified before use."""
        if r.refused is not None:
            return
        try:
            async with self.http.get(r.url + self.health_path, timeout=aiohttp.ClientTimeout(
                    total=min(5.0, self._settings.upstream_connect_timeout))) as resp:
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
                if self._info is None:
                    raise  # at start: refuse to serve
                log.error("upstream %s is not used: %s", r.url, exc)
                return
        if not r.healthy:
            log.info("upstream %s is up", r.url)
        r.healthy, r.reason = True, None

    async def _verify(self, r: Replica) -> None:
        info = await self.describe(r)
        first = next((x.info for x in self._replicas if x.info is not None), None)
        if first is not None and (info.model, info.max_model_len) != (first.model,
                                                                       first.max_model_len):
            raise EngineStartError(  # kept out, as a replica with another tokenizer is
                f"upstream {r.url} serves {info.model!r} with {info.max_model_len} tokens per "
                f"sequence; the others serve {first.model!r} with {first.max_model_len}")
        pinned = self._model
        self._model = pinned or info.model  # the name the probe's requests carry
        try:
            await self._probe_tokenizer(r)
        except BaseException:
            self._model = pinned  # not from a replica that is refused or failed
            raise
        r.info = info
        log.info("upstream %s verified: model %r, %d tokens per sequence%s", r.url, info.model,
                 info.max_model_len, f", {info.mode}" if info.mode else "")

    async def _probe_tokenizer(self, r: Replica) -> None:
        if self._settings.check_upstream_tokenizer:
            tok = self._spec.source.tokenizer

            async def reference(texts: Sequence[str]) -> list[list[int]]:
                got = await self.tokenize(r, texts)
                if got is None:
                    log.warning("upstream %s cannot tokenize: its tokenizer is taken on trust",
                                r.url)
                    return [tok.encode(t, parse_special=True) for t in texts]
                return got

            miss = await first_mismatch(tok, reference)
            if miss is not None:
                raise TokenizerParityError(miss.describe(f"upstream {r.url}"))

    # -- admission ----------------------------------------------------------------------------

    async def submit(self, prompt: Sequence[int], params: SamplingParams) -> _Stream:
        check_prompt(prompt, self.info)
        reps = self._replicas
        order = self._router.order(prompt, [r.healthy for r in reps],
                                   [r.in_flight for r in reps], salt=params.cache_salt,
                                   cache_key=params.cache_key)
        failures: list[_Failover] = []
        for i in order:
            r = reps[i]
            try:
                stream = await self._open(r, prompt, params)
            except _Failover as exc:
                failures.append(exc)
                continue
            self._router.record(prompt, i, salt=params.cache_salt, cache_key=params.cache_key)
            r.served += 1
            return stream
        if failures and all(f.rate_limited for f in failures):
            raise RateLimitError("every upstream replica is at capacity: " +
                                 "; ".join(str(f) for f in failures))
        why = "; ".join(str(f) for f in failures) or "none is up"
        raise ServiceUnavailableError(f"no upstream replica can serve this request: {why}")

    async def _open(self, r: Replica, prompt: Sequence[int], params: SamplingParams) -> _Stream:
        path, body = self.request(r, prompt, params)
        # a whole response comes when it is done: no read timeout can tell a slow one
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._settings.
                                        upstream_connect_timeout, sock_read=None) \
            if body.get("stream") is False else None
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
                why = str(self.protocol_error(status, _json(data), r.name))
                raise _Failover(why, rate_limited=status == 429)
            if status in (401, 403, 404):  # misconfigured for us: out until checked again
                r.down(f"answered {status}: {data[:200]!r}")
                raise _Failover(f"{r.name}: answered {status}")
            if status >= 500:  # this request failed there; the replica may serve others
                log.warning("upstream %s answered %d: %r", r.url, status, data[:200])
                raise _Failover(f"{r.name}: answered {status}")
            raise self.protocol_error(status, _json(data), r.name)
        stream = _Stream(self, r, resp, self.decoder(r, prompt, params))
        await stream.prime()
        return stream


def structural_tag(grammar: Grammar) -> str:
    """A lazy grammar as vLLM's and SGLang's `structural_tag` (the legacy shape both read:
    `vllm/sampling_params.py` StructuredOutputsParams, SGLang's sampling_params.py): free text
    until a trigger, then one of the structures (`begin`, a value of `schema`, `end`)."""
    if not grammar.tags:
        raise UnsupportedParameterError(
            "this upstream takes lazy grammars only as structural tags", param="tool_choice")
    return json.dumps({
        "type": "structural_tag",
        "structures": [{"begin": t.begin, "schema": json.loads(t.schema), "end": t.end}
                       for t in grammar.tags],
        "triggers": list(grammar.triggers),
    }, ensure_ascii=False)

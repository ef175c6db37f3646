"""`EmbeddedEngine`: the embedded llama.cpp engine, in a process of its own (core.py).

The HTTP process holds a connection to the engine process and nothing of llama.cpp: a native
crash there costs the sequences in flight an `EngineCrashedError` (in-band in a stream, a 503
with Retry-After for a whole request) and new requests a 503 while the supervisor starts it
again; the server, its stores and its other models stay up. The process that owns the engine
process (the serve command's, or `--workers`' supervisor) runs the `Supervisor`; every HTTP
process connects to its socket, and reconnects after a restart.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...errors import EngineCrashedError, ServiceUnavailableError, TokenwireError
from ...tokenizers.hf import HFTokenizer
from ...tokenizers.probe import TokenizerParityError, first_mismatch
from .._events import QueuedEvents
from ..base import (
    ControlAnswer,
    ControlCall,
    EngineBase,
    EngineHealth,
    EngineInfo,
    FinishEvent,
    ProcessHealth,
    SamplingParams,
    check_prompt,
)
from ._wire import Failure, frame, read_frame
from .core import CoreConfig
from .supervisor import Supervisor, read_status

__all__ = ["EmbeddedEngine"]

SETS_WEIGHTS = frozenset({"update_weights", "update_weight_version", "finish_weight_update",
                          "collective_rpc"})
"""Control calls after which the weights serving are the ones the control plane set."""

log = logging.getLogger(__name__)


class _Stream(QueuedEvents):
    """One sequence's events, as the engine process sends them."""

    def __init__(self, engine: EmbeddedEngine, key: int):
        super().__init__()
        self._engine = engine
        self._key = key

    def _cancel(self) -> None:
        self._engine._cancel(self._key)


class EmbeddedEngine(EngineBase):
    """Implements `Engine` for the engine process of one GGUF model."""

    def __init__(self, config: CoreConfig, status: Path, *, own: bool,
                 tokenizer: HFTokenizer | None = None,
                 on_give_up: Callable[[str], None] | None = None):
        """`own`: start (and restart) the engine process here; else connect to the one a
        parent process supervises (`--workers`). `status`: the supervisor's status file."""
        self._config = config
        self._status = status
        self._tokenizer = tokenizer
        self._supervisor = Supervisor(config, status, on_give_up) if own else None
        self._info: EngineInfo | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._keys = itertools.count()
        self._streams: dict[int, _Stream] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._closing = False
        self._restore_error: str | None = None
        self.backend = ""
        """The CPU and ggml variant the engine process runs on."""
        self._n_active = 0
        self._n_waiting = 0
        self.on_step: Callable[[int], None] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._reader_task is not None:
            return
        if self._supervisor is not None:
            await asyncio.to_thread(self._supervisor.start)
        await self._connect(wait=30.0)
        if self._tokenizer is not None:
            miss = await first_mismatch(self._tokenizer, self._tokenize)
            if miss is not None:
                await self.aclose()
                raise TokenizerParityError(miss.describe(
                    f"llama.cpp ({Path(self._config.model).name})"))

    async def _connect(self, wait: float) -> None:
        deadline = time.monotonic() + wait
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self._config.socket)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise ServiceUnavailableError("the engine process is not serving",
                                                  retry_after=1) from None
                await asyncio.sleep(0.05)
        kind, info, backend, restore_error = await read_frame(reader)
        assert kind == "hello"
        self._info, self.backend, self._restore_error = info, backend, restore_error
        self._writer = writer
        self._reader_task = asyncio.create_task(self._read(reader, writer))

    async def aclose(self) -> None:
        self._closing = True
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._supervisor is not None:
            await asyncio.to_thread(self._supervisor.stop)

    # -- the engine's messages -------------------------------------------------------------

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                message = await read_frame(reader)
                kind = message[0]
                if kind == "events":
                    _, items, steps, self._n_active, self._n_waiting = message
                    streams = self._streams
                    for key, ev in items:
                        stream = streams.get(key)
                        if stream is None:
                            continue
                        if isinstance(ev, Failure):
                            ev = ev.error()
                        if isinstance(ev, FinishEvent | TokenwireError):
                            del streams[key]
                        stream.queue.put_nowait(ev)
                    if steps and self.on_step is not None:
                        for n in steps:
                            self.on_step(n)
                else:
                    future = self._calls.pop(message[1], None)
                    if future is not None and not future.done():
                        if kind == "refused":
                            future.set_exception(message[2].error())
                        else:
                            future.set_result(message[2] if kind == "reply" else None)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:  # a frame we cannot read: the connection is lost all the same
            log.exception("reading from the engine process failed")
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = None
        if not self._closing:
            await self._lost()

    async def _lost(self) -> None:
        """The engine process went away: every sequence and call in flight fails, naming
        why; then connect again once it is back."""
        reason = await self._exit_reason()
        log.error("the engine process died (%s): %d sequences in flight fail", reason,
                  len(self._streams))
        err = EngineCrashedError(f"the engine process died ({reason}) mid-request; it is "
                                 "restarting: retry")
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.queue.put_nowait(err)
        calls, self._calls = self._calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(err)
        self._n_active = self._n_waiting = 0
        while not self._closing:
            if read_status(self._status).get("state") == "failed":
                return
            try:
                await self._connect(wait=1.0)
                log.info("the engine process is back (%s)", self.backend)
                return
            except (ServiceUnavailableError, OSError, asyncio.IncompleteReadError):
                await asyncio.sleep(0.1)

    async def _exit_reason(self) -> str:
        """The supervisor's word for the exit (it writes it as soon as it sees the process
        gone), waited for briefly."""
        for _ in range(40):
            status = read_status(self._status)
            if status.get("state") in ("restarting", "failed", "stopped"):
                return str(status.get("last_exit", "exited"))
            await asyncio.sleep(0.025)
        return "exited"

    def _send(self, message: object) -> None:
        if self._writer is None:
            raise self._down()
        self._writer.write(frame(message))

    def _down(self) -> ServiceUnavailableError:
        status = read_status(self._status)
        if status.get("state") == "failed":
            return ServiceUnavailableError(f"the engine process is down: {status['last_exit']}")
        if self._closing:
            return ServiceUnavailableError("the engine is shut down")
        last = status.get("last_exit")
        return ServiceUnavailableError("the engine process is restarting" + (
            f" (it died: {last})" if last else ""), retry_after=1)

    def _cancel(self, key: int) -> None:
        if self._streams.pop(key, None) is not None and self._writer is not None:
            self._writer.write(frame(("cancel", key)))

    async def _call(self, name: str, arg: object) -> Any:
        key = next(self._keys)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._send(("call", key, name, arg))
        self._calls[key] = future
        return await future

    async def _tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        return list(await self._call("tokenize", list(texts)))

    # -- Engine ----------------------------------------------------------------------------

    @property
    def info(self) -> EngineInfo:
        if self._info is None:
            raise ServiceUnavailableError("the engine has not been started")
        return self._info

    async def submit(self, prompt: Sequence[int], params: SamplingParams) -> _Stream:
        check_prompt(prompt, self.info)
        key = next(self._keys)
        admitted: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._send(("submit", key, list(prompt), params))
        stream = _Stream(self, key)
        self._streams[key] = stream
        self._calls[key] = admitted
        try:
            await admitted
        except TokenwireError:  # refused: nothing runs
            self._streams.pop(key, None)
            stream.done = True
            raise
        except BaseException:  # the caller went away: it may be admitted meanwhile
            stream.close()
            raise
        return stream

    def health(self) -> EngineHealth:
        status = read_status(self._status)
        process = ProcessHealth(state=status.get("state", "starting"), pid=status.get("pid"),
                                restarts=status.get("restarts", 0),
                                last_exit=status.get("last_exit"), backend=status.get("backend"))
        if self._writer is None:
            return EngineHealth(ok=False, reason=str(self._down()), engine_process=process)
        if self._restore_error is not None:
            return EngineHealth(ok=True, reason="the engine restarted without the weights "
                                f"the control plane had set: {self._restore_error}",
                                engine_process=process)
        return EngineHealth(ok=True, engine_process=process)

    @property
    def n_active(self) -> int:
        return self._n_active

    @property
    def n_waiting(self) -> int:
        return self._n_waiting

    @property
    def restarts(self) -> int:
        """Times the engine process was started again after it died."""
        return int(read_status(self._status).get("restarts", 0))

    async def control(self, call: ControlCall) -> list[ControlAnswer]:
        """vLLM's RL endpoints, answered by the engine process (one replica: nothing to hold;
        a paused engine queues requests until it resumes)."""
        answers: list[ControlAnswer] = await self._call("control", call)
        if call.op in SETS_WEIGHTS and answers and answers[0].ok:
            self._restore_error = None  # what serves now is what the control plane set
        return answers

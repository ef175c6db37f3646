"""The engine process: one `LlamaCppEngine`, served to the HTTP processes on a Unix socket.

Started by `supervisor.py` as `python -m tokenwire.engines.embedded CONFIG_JSON`. It loads
the CPU variant and the model, decodes a small multi-token batch (the self-check: a build whose
kernels crash on this CPU dies here, before the server says it is up), restores what the
control plane had set before a crash (`state_path`), listens, and says so on stdout (one JSON
line per stage). Each HTTP process is one connection:

    -> ("submit", key, prompt, params)   <- ("admitted", key) | ("refused", key, Failure)
    -> ("cancel", key)
    -> ("call", key, "control" | "tokenize", arg)   <- ("reply", key, value) | ("refused", ...)
    <- ("hello", EngineInfo, backend, restore_error)   first, on connecting
    <- ("events", [(key, event | Failure)], steps, n_active, n_waiting)

Events of one decode step leave in one frame: the worker thread appends to the connection's
outbox and wakes the event loop once (`_Connection.emit`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import EngineError, ServiceUnavailableError, TokenwireError
from ..base import ControlCall, EngineEvent, FinishEvent, SamplingParams
from ._wire import Failure, frame, read_frame

if TYPE_CHECKING:  # llama.cpp is loaded by the engine process only, never the HTTP ones
    from ...tokenizers.hf import HFTokenizer
    from ..cpu import CpuBackend
    from ..llamacpp import LlamaCppEngine

__all__ = ["CoreConfig", "FAULT_ENV", "START_ENV", "llama_engine", "main"]

log = logging.getLogger("tokenwire.engine")

FAULT_ENV = "TOKENWIRE_ENGINE_FAULT"
"""Tests only: "self-check" or "self-check@N" makes the self-check of the Nth start and every
later one die by SIGSEGV, as a crashing kernel would."""
START_ENV = "TOKENWIRE_ENGINE_START"
"""Which start of the engine process this is (1, then 2 after the first restart, ...)."""


@dataclass(frozen=True)
class CoreConfig:
    """The engine's settings (`LlamaCppEngine`'s arguments) and where it serves."""

    model: str
    socket: str
    state: str
    """The control plane's state (JSON), kept across restarts."""
    model_id: str | None = None
    max_model_len: int | None = None
    n_parallel: int = 4
    n_batch: int = 512
    n_threads: int | None = None
    max_queued: int = 256
    prefix_cache: bool = True
    deterministic: bool = False
    logprobs_mode: str = "raw_logprobs"
    sampling_mask: bool = False
    cpu_variant: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def _say(**fields: Any) -> None:
    """A stage, for the supervisor (stdout is its pipe until ready)."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def _fault(stage: str) -> None:
    fault = os.environ.get(FAULT_ENV, "")
    name, _, at = fault.partition("@")
    if name == stage and int(os.environ.get(START_ENV, "1")) >= int(at or 1):
        os.kill(os.getpid(), signal.SIGSEGV)


async def _self_check(engine: LlamaCppEngine) -> None:
    """Two sequences of 24 prompt ids and two sampled ids each, in shared batches: the
    multi-token matrix products that crash a bad kernel build (llama.cpp #20824)."""
    n = min(24, engine.info.max_model_len - 4)
    prompts = [[(7 * i + k) % engine.info.vocab_size for i in range(n)] for k in (1, 2)]
    _fault("self-check")
    streams = [await engine.submit(p, SamplingParams(max_tokens=2, temperature=0))
               for p in prompts]
    for stream in streams:
        async for ev in stream:
            if isinstance(ev, FinishEvent):
                break


async def _restore(engine: LlamaCppEngine, path: Path) -> str | None:
    """What the control plane set before a restart, set again; why not, if it cannot be."""
    if not path.is_file():
        return None
    state = json.loads(path.read_text())
    try:
        if state["weights"] != engine.control_state()["weights"]:
            await engine.load_weights(Path(state["weights"]), state["base_version"])
        if state["adapters"]:
            await engine.load_lora([(Path(p), float(s)) for p, s in state["adapters"]],
                                   state["version"])
        if state["version"] != engine.weight_version:
            await engine.set_weight_version(state["version"])
        if state["paused"] is not None:
            await engine.pause(state["paused"])
    except (TokenwireError, OSError, RuntimeError) as exc:
        log.error("the engine restarted but could not restore its weights (%s): it serves %s",
                  exc, engine.weight_version)
        return f"{exc} (serving {engine.weight_version})"
    log.info("restored the control plane's state: version %s%s", engine.weight_version,
             ", paused" if engine.paused else "")
    return None


class _Connection:
    """One HTTP process."""

    def __init__(self, core: _Core, writer: asyncio.StreamWriter):
        self._core = core
        self._writer = writer
        self._loop = asyncio.get_running_loop()
        self._outbox: list[tuple[int, EngineEvent | Failure]] = []
        self._woken = False
        self.cancels: dict[int, Callable[[], None]] = {}
        self.cancelled_early: set[int] = set()
        """Sequences cancelled while their admission was under way."""

    def emit(self, key: int) -> Callable[[EngineEvent | BaseException], None]:
        def emit(ev: EngineEvent | BaseException) -> None:  # on the worker thread
            out: EngineEvent | Failure
            if isinstance(ev, BaseException):
                out = Failure.of(ev if isinstance(ev, TokenwireError)
                                 else EngineError(f"the engine failed: {ev}"))
            else:
                out = ev
            self._outbox.append((key, out))
            if not self._woken:
                self._woken = True
                try:
                    self._loop.call_soon_threadsafe(self.flush)
                except RuntimeError:  # the loop closed: the process is ending
                    pass
        return emit

    def flush(self) -> None:
        self._woken = False  # first: an event appended from now on wakes the loop again
        items, self._outbox = self._outbox, []
        for key, ev in items:
            if isinstance(ev, FinishEvent | Failure):
                self.cancels.pop(key, None)
        self.send(("events", items, self._core.take_steps(), self._core.engine.n_active,
                   self._core.engine.n_waiting))

    def send(self, message: object) -> None:
        if not self._writer.is_closing():
            self._writer.write(frame(message))

    def close(self) -> None:
        for cancel in self.cancels.values():
            cancel()
        self.cancels.clear()


class _Core:
    def __init__(self, engine: LlamaCppEngine, config: CoreConfig, backend: CpuBackend,
                 restore_error: str | None):
        self.engine = engine
        self._config = config
        self._backend = backend
        self._restore_error = restore_error
        self._steps: list[int] = []
        engine.on_step = self._step
        self._connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def _step(self, n: int) -> None:  # on the worker thread, after each decode
        self._steps.append(n)

    def take_steps(self) -> list[int]:
        steps, self._steps = self._steps, []
        return steps

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(self, writer)
        conn.send(("hello", self.engine.info, self._backend.describe(), self._restore_error))
        self._connections.add(conn)
        try:
            while True:
                self._handle(conn, await read_frame(reader))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._connections.discard(conn)
            conn.close()
            writer.close()

    async def report_load(self) -> None:
        """Queue depths change without events too (a cancelled sequence leaves silently):
        every HTTP process hears of a change within 0.1 s, for /metrics."""
        last = (0, 0)
        while True:
            await asyncio.sleep(0.1)
            now = (self.engine.n_active, self.engine.n_waiting)
            if now != last:
                last = now
                for conn in list(self._connections):
                    conn.send(("events", [], [], *now))

    def _handle(self, conn: _Connection, message: tuple[Any, ...]) -> None:
        kind, key = message[0], message[1]
        if kind == "cancel":
            cancel = conn.cancels.pop(key, None)
            if cancel is not None:
                cancel()
            else:
                conn.cancelled_early.add(key)
        elif kind == "submit":
            self._spawn(self._submit(conn, key, message[2], message[3]))
        elif kind == "call":
            self._spawn(self._call(conn, key, message[2], message[3]))

    def _spawn(self, job: Coroutine[Any, Any, None]) -> None:
        """Run `job` as a task, held until it ends (the loop keeps only weak references)."""
        task = asyncio.create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _submit(self, conn: _Connection, key: int, prompt: list[int],
                      params: SamplingParams) -> None:
        try:
            await self.engine.prepare(prompt, params)
            cancel = self.engine.admit(prompt, params, conn.emit(key))
        except TokenwireError as exc:
            conn.cancelled_early.discard(key)
            conn.send(("refused", key, Failure.of(exc)))
            return
        if key in conn.cancelled_early:  # its client went away during admission
            conn.cancelled_early.discard(key)
            cancel()
            return
        conn.cancels[key] = cancel
        conn.send(("admitted", key))

    async def _call(self, conn: _Connection, key: int, name: str, arg: Any) -> None:
        try:
            if name == "control":
                assert isinstance(arg, ControlCall)
                value: Any = await self.engine.control(arg)
                self._keep_state()
            elif name == "tokenize":
                llama = self.engine.llama
                value = [llama.tokenize(t, parse_special=True) for t in arg]
            else:
                raise ServiceUnavailableError(f"no engine call {name!r}")
        except TokenwireError as exc:
            conn.send(("refused", key, Failure.of(exc)))
            return
        conn.send(("reply", key, value))

    def _keep_state(self) -> None:
        path = Path(self._config.state)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.engine.control_state()))
        tmp.replace(path)


def llama_engine(config: CoreConfig, tokenizer: HFTokenizer | None = None) -> LlamaCppEngine:
    """The one place a `LlamaCppEngine` is built from settings (`core_config`'s): here, in
    the engine process, and in the HTTP process where `engine_process` is off
    (engines/factories.py). The CPU backend (`config.cpu_variant`) must be loaded first."""
    from ..llamacpp import LlamaCppEngine

    return LlamaCppEngine(
        config.model, model_id=config.model_id, max_model_len=config.max_model_len,
        n_parallel=config.n_parallel, n_batch=config.n_batch, n_threads=config.n_threads,
        max_queued=config.max_queued, tokenizer=tokenizer, prefix_cache=config.prefix_cache,
        deterministic=config.deterministic, logprobs_mode=config.logprobs_mode,
        sampling_mask=config.sampling_mask)


async def _run(config: CoreConfig) -> None:
    from ..cpu import load_cpu_backend

    backend = load_cpu_backend(config.cpu_variant)
    _say(stage="loading", backend=backend.describe())
    engine = llama_engine(config)
    await engine.start()
    _say(stage="self-check", backend=backend.describe())
    await _self_check(engine)
    if config.prefix_cache:
        await engine.reset_prefix_cache()  # the check's ids are nobody's prefix
    restore_error = await _restore(engine, Path(config.state))
    core = _Core(engine, config, backend, restore_error)
    server = await asyncio.start_unix_server(core.serve, path=config.socket)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    _say(stage="ready", backend=backend.describe(), pid=os.getpid())
    os.dup2(2, 1)  # from now on stdout is the log's
    tasks = [asyncio.create_task(_watch(engine, stop)), asyncio.create_task(core.report_load())]
    async with server:
        await stop.wait()
    for task in tasks:
        task.cancel()
    await engine.aclose()


async def _watch(engine: LlamaCppEngine, stop: asyncio.Event) -> None:
    """A server killed outright (SIGKILL) cannot stop its engine: it stops when orphaned. An
    engine whose worker thread stopped on an error (its sequences failed with it) is restarted
    fresh: the process exits, and the supervisor starts another."""
    parent = os.getppid()
    while True:
        await asyncio.sleep(0.5)
        if os.getppid() != parent:
            log.warning("the server that started the engine process is gone: stopping")
            stop.set()
            return
        health = engine.health()
        if not health.ok:
            log.error("%s: the engine process exits, to be started again", health.reason)
            os._exit(70)


def main(argv: list[str] | None = None) -> int:
    config = CoreConfig(**json.loads((argv or sys.argv[1:])[0]))
    logging.basicConfig(level=os.environ.get("TOKENWIRE_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's Ctrl-C is the supervisor's
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    try:
        with runner:
            runner.run(_run(config))
    except TokenwireError as exc:
        _say(stage="failed", error=str(exc))
        return 1
    except (OSError, RuntimeError, ValueError) as exc:
        _say(stage="failed", error=f"{type(exc).__name__}: {exc}")
        return 1
    return 0


"""tokenwire side by side with llama.cpp's `llama-server` (built from the same llama.cpp
sources) and llama-cpp-python's server, on the same GGUF (the embedded SmolLM2-135M-Instruct
Q4_1) and the same configuration: 8 sequences of 2048 tokens, 2 threads, batches of 512.

    .venv/bin/python bench/compare.py [--rounds 5] [--quick] [--out docs]   # or `make bench`

Each contender is started once on loopback and sent one workload at a time, alternating
contenders round by round (A B C, A B C, ...); each figure is reported as the median over
rounds and as the median of the per-round ratios to llama-server, with their range. Greedy
chat completions streamed over HTTP:

- 1 stream: tokens/s of a 128-token story (completion tokens over the whole request);
- 8 concurrent streams of one prompt: aggregate tokens/s, TTFT p50, the server's peak RSS;
- prefix cache: TTFT with a fresh ~1.5k-token system prompt (cold), then a second question
  on it (warm);
- agent: one 10-turn conversation, each turn adding ~200 tokens (a tool result and the
  reply, max_tokens 64): the wall time of the whole conversation;
- defaults: each server with no configuration flags at all (model, host and port only),
  1 stream and 8 streams.

Prints a markdown table, writes docs/bench.json (machine, commit, commands, every round's raw
numbers) and docs/bench.png. A contender that cannot start is named in the table; the rest go
on. Every server is stopped (its whole process group) however this ends.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _report  # noqa: E402
from bench._report import Metric  # noqa: E402
from bench._servers import Server, StartError, clean_env, free_port  # noqa: E402
from bench._workloads import WorkloadError, agent, concurrent, prefix_cache, single  # noqa: E402
from tokenwire.config import default_model_path  # noqa: E402

BASELINE = "llama-server"
IN_PROCESS = "tokenwire in-process"
N_SEQ, SEQ_LEN, THREADS, N_BATCH = 8, 2048, 2, 512  # N_BATCH: tokenwire's default n_batch
AGENT_TURNS = 10


@dataclass(frozen=True)
class Contender:
    name: str
    argv: Callable[[int], list[str]]  # port -> command line
    ready: str  # GET path that answers 200 once it serves
    env: dict[str, str] = field(default_factory=dict)


def contenders(model: Path, llama_server: Path, configured: bool) -> list[Contender]:
    """The three servers, with the shared configuration or with none (`configured=False`)."""
    tw = Path(sys.executable).with_name("tokenwire")
    # llama-cpp-python's server on the same wheel: ggml's CPU variant loaded first, as
    # tokenwire's engine loads it (ggml itself looks beside the executable, not in the wheel)
    llama_cpp = [sys.executable, "-c", "import runpy, sys; from tokenwire.engines.cpu import "
                 "load_cpu_backend; load_cpu_backend(); sys.argv[0] = 'llama_cpp.server'; "
                 "runpy.run_module('llama_cpp.server', run_name='__main__', alter_sys=True)",
                 "--model", str(model), "--host", "127.0.0.1"]
    if not configured:
        return [
            Contender("tokenwire", lambda p: [str(tw), "serve", "--port", str(p)], "/health"),
            Contender(IN_PROCESS, lambda p: [str(tw), "serve", "--port", str(p),
                                             "--no-engine-process"], "/health"),
            Contender(BASELINE, lambda p: [str(llama_server), "-m", str(model), "--host",
                                           "127.0.0.1", "--port", str(p)], "/health"),
            Contender("llama-cpp-python", lambda p: [*llama_cpp, "--port", str(p)],
                      "/v1/models"),
        ]
    n, t = str(N_SEQ), str(THREADS)
    return [
        Contender("tokenwire", lambda p: [str(tw), "serve", "--port", str(p), "--n-parallel",
                                          n, "--max-model-len", str(SEQ_LEN)],
                  "/health", {"TOKENWIRE_N_THREADS": t}),
        # the same engine in the server's process (as before it had one of its own): what the
        # transport between the two processes costs
        Contender(IN_PROCESS, lambda p: [str(tw), "serve", "--port", str(p), "--n-parallel",
                                         n, "--max-model-len", str(SEQ_LEN),
                                         "--no-engine-process"],
                  "/health", {"TOKENWIRE_N_THREADS": t}),
        # -b/-ub: tokenwire's n_batch (its ubatch is the same); -np given, so each slot has
        # its own -c/np cells (kv_unified off), as in tokenwire
        Contender(BASELINE, lambda p: [str(llama_server), "-m", str(model), "--host",
                                       "127.0.0.1", "--port", str(p), "-np", n, "-c",
                                       str(N_SEQ * SEQ_LEN), "-t", t, "-b", str(N_BATCH),
                                       "-ub", str(N_BATCH), "--jinja"], "/health"),
        # one sequence (it serves one request at a time); queue concurrent requests instead of
        # cutting the running stream short (interrupt_requests), flash attention as llama.cpp's
        # `auto` resolves on this CPU, no logits for every prompt token (its server's default)
        Contender("llama-cpp-python", lambda p: [
            *llama_cpp, "--port", str(p), "--n_ctx", str(SEQ_LEN), "--n_threads", t,
            "--n_threads_batch", t, "--n_batch", str(N_BATCH), "--n_ubatch", str(N_BATCH),
            "--flash_attn", "true", "--logits_all", "false", "--interrupt_requests", "false"],
            "/v1/models"),
    ]


def metrics(tokens: int, agent_tokens: int) -> list[Metric]:
    c, d = "configured", "defaults"
    return [
        Metric(c, "single", "tok_s", f"1 stream, {tokens}-token chat: tokens/s of the whole "
               "request", "1 stream tok/s", "tok/s", "higher"),
        Metric(c, "concurrent", "agg_tok_s", f"8 concurrent streams, {tokens} tokens each: "
               "aggregate tokens/s", "8 streams tok/s", "tok/s", "higher"),
        Metric(c, "concurrent", "ttft_p50_s", "8 concurrent streams of one prompt: TTFT p50",
               "8 streams TTFT p50", "s", "lower"),
        Metric(c, "prefix", "cold_ttft_s", "~1.5k-token prefix, fresh: TTFT (cold)",
               "prefix cold TTFT", "s", "lower"),
        Metric(c, "prefix", "warm_ttft_s", "same prefix, second question: TTFT (warm)",
               "prefix warm TTFT", "s", "lower"),
        Metric(c, "prefix", "warm_over_cold", "prefix cache: warm TTFT / cold TTFT",
               "prefix warm/cold", "ratio", "lower"),
        Metric(c, "agent", "wall_s", f"agent: {AGENT_TURNS} turns, ~200 tokens added each, "
               f"max_tokens {agent_tokens}: wall time", "agent 10 turns", "s", "lower"),
        Metric(c, "concurrent", "rss_max_mib", "resident memory during the 8 streams: max RSS",
               "RSS at 8 streams (llama-cpp-python: 1 sequence)", "MiB", "lower"),
        Metric(d, "single", "tok_s", "defaults (no flags), 1 stream: tokens/s",
               "no flags: 1 stream", "tok/s", "higher"),
        Metric(d, "concurrent", "agg_tok_s", "defaults (no flags), 8 concurrent streams: "
               "aggregate tokens/s", "no flags: 8 streams", "tok/s", "higher"),
    ]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# keep-alive shorter than llama-server's 5 s; and a client of its own for each workload, so
# a connection the server dropped (llama-server: after a request over 5 s) can stall none but
# the next request on it, which chat() sends once more
_LIMITS = httpx.Limits(max_connections=4 * N_SEQ, max_keepalive_connections=4 * N_SEQ,
                       keepalive_expiry=1.0)


async def _attempt(workload: Callable[..., Any], server: Server, *args: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=600, limits=_LIMITS) as http:
        try:
            result: dict[str, Any] = await workload(http, server, *args)
            return result
        except (httpx.HTTPError, WorkloadError, ValueError) as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}


async def measure(servers: list[Server], phase: str, rounds: int, tokens: int,
                  agent_tokens: int) -> tuple[dict[str, list[dict[str, Any]]], dict[str, float]]:
    """Each round, each server in turn runs the phase's workloads, alone on the machine."""
    raw: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
    for s in servers:  # warm-up, unmeasured; then what the server costs while idle
        await _attempt(single, s, 8, f"warm-up {phase}")
    before = {s.name: s.cpu_seconds() for s in servers}
    await asyncio.sleep(2.0)
    idle = {s.name: 50.0 * (s.cpu_seconds() - before[s.name]) for s in servers}
    for r in range(rounds):
        for s in servers:
            if not s.alive():
                raw[s.name].append({"error": "the server exited"})
                continue
            _log(f"{phase} round {r + 1}/{rounds}: {s.name}")
            nonce = f"{phase}-{r}"
            got = {"single": await _attempt(single, s, tokens, nonce),
                   "concurrent": await _attempt(concurrent, s, tokens, N_SEQ, nonce + "-c")}
            if phase == "configured":
                got["prefix"] = await _attempt(prefix_cache, s, nonce)
                got["agent"] = await _attempt(agent, s, AGENT_TURNS, agent_tokens, nonce)
            for name, res in got.items():
                if "error" in res:
                    _log(f"  {name}: {res['error']}")
            raw[s.name].append(got)
    return raw, idle


def notes(raw: dict[str, dict[str, list[dict[str, Any]]]]) -> list[str]:
    """What the table's medians hide: streams a server cut short, and what differs by design."""
    out = ["llama-cpp-python's server holds one sequence (it serves one request at a time): "
           "its RSS is for 2048 tokens of KV cache, the others' for 8 x 2048."]
    for phase, by_name in raw.items():
        for name, rounds in by_name.items():
            cut = sum((r.get("concurrent") or {}).get("cut", 0) for r in rounds)
            if cut:
                out.append(f"{name} ({phase}): {cut} of {N_SEQ * len(rounds)} concurrent "
                           "streams cut short by the server (no finish_reason)")
    return out


def _run(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return ""
    return (p.stdout + p.stderr).strip()


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines()
             if ln.startswith("model name")]
    mem = next((ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                if ln.startswith("MemTotal")), "0") if Path("/proc/meminfo").exists() else "0"
    return {"cpu": names[0] if names else platform.processor(), "cores": os.cpu_count(),
            "memory_gib": round(int(mem) / 2**20, 1), "kernel": platform.release(),
            "python": platform.python_version(), "loadavg_at_start": os.getloadavg()}


def versions(llama_server: Path) -> dict[str, str]:
    def dist(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    ls = [ln for ln in _run([str(llama_server), "--version"]).splitlines() if "version" in ln]
    return {"tokenwire": dist("tokenwire"), "llama-cpp-python": dist("llama-cpp-python"),
            "llama-server": ls[0] if ls else "unknown"}


def _default_llama_server() -> Path:
    """Where the Makefile builds it: from the llama.cpp that our llama-cpp-python vendors (a
    folder per build recipe: the newest)."""
    version = importlib.metadata.version("llama-cpp-python")
    built = sorted((Path.home() / ".cache" / "tokenwire").glob(f"llama-server-{version}-*"),
                   key=lambda p: p.stat().st_mtime)
    return (built[-1] if built else Path("llama-server-not-built")) / "llama-server"


def _terminate(signum: int, _frame: Any) -> NoReturn:
    raise SystemExit(128 + signum)  # unwinds through the finally that stops the servers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128, help="max_tokens of the streams")
    ap.add_argument("--agent-tokens", type=int, default=64, help="max_tokens per agent turn")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke test: 1 round, 32-token streams, 16-token agent turns")
    ap.add_argument("--out", type=Path, default=ROOT / "docs", help="bench.json, bench.png")
    ap.add_argument("--no-defaults", action="store_true", help="skip the no-flags row")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.tokens, args.agent_tokens = 1, 32, 16
    signal.signal(signal.SIGTERM, _terminate)
    model = default_model_path()
    llama_server = Path(os.environ.get("TOKENWIRE_LLAMA_SERVER") or _default_llama_server())
    tmp = Path(tempfile.mkdtemp(prefix="tw-compare-"))
    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "git": {"commit": _run(["git", "rev-parse", "HEAD"]),
                "dirty": bool(_run(["git", "status", "--porcelain"]))},
        "versions": versions(llama_server), "model": str(model), "quick": args.quick,
        "rounds": args.rounds, "logs": str(tmp),
        "configuration": {"sequences": N_SEQ, "tokens_per_sequence": SEQ_LEN,
                          "threads": THREADS, "n_batch": N_BATCH, "n_ubatch": N_BATCH,
                          "stream_tokens": args.tokens, "agent_turns": AGENT_TURNS,
                          "agent_max_tokens": args.agent_tokens, "temperature": 0,
                          "tokens_per_s": "completion tokens over the whole request (sent "
                                          "to last token); 8 streams: over the wall time of "
                                          "all 8"},
        "contenders": {}, "raw": {}, "idle_cpu_percent": {},
    }
    if doc["machine"]["loadavg_at_start"][0] > 0.5:
        _log(f"warning: load average {doc['machine']['loadavg_at_start'][0]:.2f} at start: "
             "if something else is running, the numbers will show it")
    down: dict[str, str] = {}
    phases = ["configured"] + ([] if args.no_defaults else ["defaults"])
    names = [c.name for c in contenders(model, llama_server, True)]
    for phase in phases:
        servers: list[Server] = []
        try:
            for c in contenders(model, llama_server, phase == "configured"):
                port = free_port()
                s = Server(c.name, c.argv(port), port, c.ready, tmp / f"{phase}-{c.name}.log",
                           clean_env(**c.env))
                doc["contenders"][f"{phase}:{c.name}"] = {"cmd": s.cmd, "env": c.env}
                _log(f"{phase}: starting {c.name}: {' '.join(s.cmd)}")
                try:
                    s.start()
                    servers.append(s)
                except StartError as exc:
                    down[f"{phase}:{c.name}"] = str(exc)
                    doc["contenders"][f"{phase}:{c.name}"]["error"] = str(exc)
                    _log(f"{c.name} did not start:\n{exc}")
            doc["raw"][phase], doc["idle_cpu_percent"][phase] = asyncio.run(
                measure(servers, phase, args.rounds, args.tokens, args.agent_tokens))
        finally:
            for s in servers:
                s.stop()
    rows = _report.summarize(metrics(args.tokens, args.agent_tokens), doc["raw"], names,
                             BASELINE)
    rows = [r for r in rows if r["phase"] in phases]
    doc["summary"] = rows
    doc["machine"]["loadavg_at_end"] = os.getloadavg()
    print(_report.table(rows, names, BASELINE, down))
    for line in notes(doc["raw"]):
        print(line)
    _report.write_json(args.out / "bench.json", doc)
    m = doc["machine"]
    title = (f"{m['cpu']}, {m['cores']} cores; {N_SEQ} x {SEQ_LEN} tokens, {THREADS} threads;"
             f" {args.rounds} round(s), median, whiskers: range; {doc['date'][:10]}")
    if args.quick:
        title = "--quick smoke test (1 round, short streams): not a measurement\n" + title
    _report.plot(args.out / "bench.png", rows, names, BASELINE, title)
    _log(f"wrote {args.out / 'bench.json'} and {args.out / 'bench.png'}; logs in {tmp}")
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    rc = main()
    _log(f"bench/compare.py took {time.monotonic() - started:.0f} s")
    raise SystemExit(rc)

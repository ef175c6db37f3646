"""How long a client waits when the embedded engine's process dies: `tokenwire serve`, its
engine process killed with a real signal, idle and mid-stream, several times.

For each kill: from the signal to the stream's in-band `engine_crashed` error (mid-stream), to
`/health` answering 503 `restarting`, and to `/health` 200 with a new engine pid; then the first
chat request after it. Prints medians and ranges over the kills.

    .venv/bin/python bench/recovery.py [--kills 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._servers import Server, clean_env, free_port  # noqa: E402

STORY = [{"role": "user", "content": "Tell me a long story about a dragon and a knight."}]


def _engine(url: str) -> dict[str, object]:
    (model,) = httpx.get(f"{url}/health", timeout=10).json()["models"].values()
    return dict(model["engine_process"])


def _back(url: str, old_pid: object, t0: float) -> tuple[float | None, float]:
    """Seconds to the first 503 `restarting` (None if never seen) and to 200 with a new pid."""
    seen = None
    while True:
        r = httpx.get(f"{url}/health", timeout=10)
        state = _engine(url) if r.status_code == 200 else {}
        if r.status_code == 503 and seen is None:
            seen = time.monotonic() - t0
        if r.status_code == 200 and state.get("pid") != old_pid and state.get("state") == "up":
            return seen, time.monotonic() - t0
        time.sleep(0.005)


def kill_idle(url: str, sig: signal.Signals) -> dict[str, float | None]:
    pid = _engine(url)["pid"]
    t0 = time.monotonic()
    os.kill(int(str(pid)), sig)
    restarting, up = _back(url, pid, t0)
    return {"restarting_s": restarting, "up_s": up, **_first_request(url)}


def kill_mid_stream(url: str, model: str) -> dict[str, float | None]:
    pid = _engine(url)["pid"]
    body = {"model": model, "messages": STORY, "stream": True, "max_tokens": 400,
            "temperature": 0, "ignore_eos": True}
    t0: list[float] = []
    error_at: list[float] = []

    def read() -> None:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
            for n, line in enumerate(r.iter_lines()):
                if n == 6 and not t0:
                    t0.append(time.monotonic())
                    os.kill(int(str(pid)), signal.SIGKILL)
                if '"engine_crashed"' in line:
                    error_at.append(time.monotonic())

    reader = threading.Thread(target=read)
    reader.start()
    while not t0:
        time.sleep(0.001)
    restarting, up = _back(url, pid, t0[0])
    reader.join()
    return {"error_s": error_at[0] - t0[0] if error_at else None, "restarting_s": restarting,
            "up_s": up, **_first_request(url)}


def _first_request(url: str) -> dict[str, float | None]:
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    t = time.monotonic()
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                   json={"model": model, "messages": STORY, "max_tokens": 8})
    return {"next_request_s": time.monotonic() - t if r.status_code == 200 else None}


def _summary(name: str, rows: list[dict[str, float | None]]) -> str:
    cells = []
    for key in rows[0]:
        vals = [r[key] for r in rows if r[key] is not None]
        cells.append(f"{key} {statistics.median(vals):.2f} [{min(vals):.2f}-{max(vals):.2f}]"
                     if vals else f"{key} -")
    return f"| {name} | {len(rows)} | " + " | ".join(cells) + " |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tw-recovery-"))
    port = free_port()
    tw = Path(sys.executable).with_name("tokenwire")
    server = Server("tokenwire", [str(tw), "serve", "--port", str(port)], port, "/health",
                    tmp / "serve.log", clean_env(TOKENWIRE_TOKENIZER_STORE=str(tmp / "tok"),
                                                 TOKENWIRE_STORAGE="none"))
    server.start()
    try:
        runs = {
            "SIGKILL, idle": [kill_idle(server.url, signal.SIGKILL) for _ in range(args.kills)],
            "SIGSEGV, idle": [kill_idle(server.url, signal.SIGSEGV) for _ in range(args.kills)],
            "SIGKILL, mid-stream": [kill_mid_stream(server.url, server.model)
                                    for _ in range(args.kills)],
        }
    finally:
        server.stop()
    print("| fault | kills | seconds from the signal: median [range] |")
    print("| --- | --- | --- |")
    for name, rows in runs.items():
        print(_summary(name, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

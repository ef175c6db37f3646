"""Real upstream processes on loopback, for the gateway tests: another tokenwire (serving
vLLM's token API), llama.cpp's llama-server, and the SGLang-protocol process (sglang_shim)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tokenwire.config import default_model_path

__all__ = ["Upstream", "free_port", "hf_tokenizer_dir", "llama_server", "sglang_shim",
           "tokenwire_upstream"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Upstream:
    """A server process; `kill` it (SIGKILL) and `start` it again on the same port."""

    name: str
    cmd: list[str]
    port: int
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180) -> Upstream:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.cmd, env={**os.environ, **self.env},
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"{self.name} did not start:\n{tail}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def tokenwire_upstream(tmp: Path, *, port: int | None = None, n_parallel: int = 4,
                       env: dict[str, str] | None = None) -> Upstream:
    """`tokenwire serve` with the embedded engine: what a gateway reaches over vLLM's API."""
    port = port or free_port()
    return Upstream(
        "tokenwire", [sys.executable, "-m", "tokenwire", "serve", "--port", str(port),
                      "--n-parallel", str(n_parallel)], port, tmp / f"tokenwire-{port}.log",
        env={"TOKENWIRE_TOKENIZER_STORE": str(tmp / f"store-{port}"), **(env or {})},
    ).start()


def llama_server_binary() -> Path:
    path = Path(os.environ.get("TOKENWIRE_LLAMA_SERVER", "")).expanduser()
    if not path.is_file():
        pytest.fail("no llama-server binary: `make test` builds one (scripts/build-llama-server.sh)"
                    " and sets TOKENWIRE_LLAMA_SERVER to it", pytrace=False)
    return path


def llama_server(tmp: Path, *, port: int | None = None, slots: int = 4,
                 ctx_per_slot: int = 8192) -> Upstream:
    """llama.cpp's own server on the same GGUF, with the embedded engine's numerics: llama.cpp's
    default flash-attention mode (auto) and the same thread count (all cores)."""
    port = port or free_port()
    return Upstream(
        "llama-server", [str(llama_server_binary()), "-m", str(default_model_path()),
                         "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
                         "-c", str(slots * ctx_per_slot), "-t", str(os.cpu_count() or 1)],
        port, tmp / f"llama-server-{port}.log").start()


def sglang_shim(tmp: Path, *, port: int | None = None, incremental: bool = False,
                deterministic: bool = False) -> Upstream:
    port = port or free_port()
    cmd = [sys.executable, "-m", "tests.upstreams.sglang_shim", "--port", str(port)]
    cmd += ["--incremental"] if incremental else []
    cmd += ["--deterministic"] if deterministic else []
    return Upstream("sglang", cmd, port, tmp / f"sglang-{port}.log").start()


def hf_tokenizer_dir(path: Path, *, break_merge: bool = False) -> Path:
    """The default model's tokenizer as a Hugging Face directory (tokenizer.json,
    tokenizer_config.json with its chat template, generation_config.json), the way a model
    served by vLLM comes. `break_merge` drops the first BPE merge (" t"): a slightly different
    tokenizer, as a wrong revision would be."""
    import json

    from tokenwire.tokenizers.gguf import tokenizer_from_gguf

    src = tokenizer_from_gguf(default_model_path())
    spec = json.loads(src.tokenizer.artifact)
    if break_merge:
        spec["model"]["merges"] = spec["model"]["merges"][1:]
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(json.dumps(spec))
    strs = {v: k for k, v in spec["model"]["vocab"].items()}
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": src.chat_template,
        "bos_token": strs[src.bos_id], "eos_token": strs[src.eos_id],
        "model_max_length": src.context_length}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": src.eos_id}))
    return path

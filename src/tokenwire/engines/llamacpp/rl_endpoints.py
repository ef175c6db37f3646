"""The embedded engine's control plane: vLLM's RL endpoints (`CONTROL_OPS`) in vLLM's shapes,
answered by the engine itself.

What vLLM does over NCCL or CUDA IPC (`update_weights` after `init_weight_transfer_engine`), the
embedded engine does from disk, which is what a CPU-only trainer has: `update_info` names a GGUF
(`weights_path`: the whole model) or LoRA adapters in GGUF (`lora_path` and `lora_scale`, or
`lora`: a list of `{path, scale}`; an empty list serves the bare model again). vLLM's own
from-disk path, `collective_rpc` with `reload_weights` and `weights_path`, works too. Sleeping
(freeing the weights' memory) is refused by name: a CPU engine has no device memory to free.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

from ...errors import InvalidRequestError, UnsupportedParameterError
from ..base import ControlAnswer, ControlCall

__all__ = ["Controlled", "PauseMode", "answer", "content_version"]

PauseMode = Literal["abort", "wait", "keep"]
REPLICA = "embedded"


class Controlled(Protocol):
    """What the control plane drives: the embedded engine (engines/llamacpp/), seen from here."""

    @property
    def paused(self) -> PauseMode | None: ...

    @property
    def weight_version(self) -> str: ...

    async def pause(self, mode: PauseMode) -> None: ...

    async def resume(self) -> None: ...

    async def set_weight_version(self, version: str) -> None: ...

    async def reset_prefix_cache(self) -> None: ...

    async def load_weights(self, path: Path, version: str | None = None) -> str: ...

    async def load_lora(self, adapters: Sequence[tuple[Path, float]],
                        version: str | None = None) -> str: ...


def content_version(path: Path) -> str:
    """A weights file's version when nobody labelled it: its content hash (sha256, 16 hex)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()[:16]}"


def _file(value: Any, param: str) -> Path:
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{param} must be the path of a GGUF file on the server",
                                  param=param)
    path = Path(value)
    if not path.is_file():
        raise InvalidRequestError(f"{param}: no file {value!r} on the server", param=param)
    return path


def _string(body: dict[str, Any], key: str, *, required: bool) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{key} must be a non-empty string", param=key)
    return value


def _adapters(info: dict[str, Any]) -> list[tuple[Path, float]]:
    if "lora" in info:
        items = info["lora"]
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise InvalidRequestError("update_info.lora must be a list of {path, scale}",
                                      param="update_info.lora")
        return [(_file(i.get("path"), f"update_info.lora[{k}].path"),
                 _scale(i.get("scale", 1.0), f"update_info.lora[{k}].scale"))
                for k, i in enumerate(items)]
    return [(_file(info["lora_path"], "update_info.lora_path"),
             _scale(info.get("lora_scale", 1.0), "update_info.lora_scale"))]


def _scale(value: Any, param: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(f"{param} must be a number", param=param)
    return float(value)


async def _update(engine: Controlled, info: Any) -> None:
    if not isinstance(info, dict):
        raise InvalidRequestError("update_info must be an object: weights_path (a GGUF), or "
                                  "lora_path / lora (LoRA adapters in GGUF)",
                                  param="update_info")
    version = _string(info, "weight_version", required=False)
    if "weights_path" in info:
        await engine.load_weights(_file(info["weights_path"], "update_info.weights_path"),
                                  version)
    elif "lora_path" in info or "lora" in info:
        await engine.load_lora(_adapters(info), version)
    else:
        raise InvalidRequestError(
            "update_info names no weights: the embedded engine reads them from disk "
            "(weights_path: a GGUF; lora_path or lora: LoRA adapters in GGUF)",
            param="update_info")


async def _run(engine: Controlled, call: ControlCall) -> Any:
    """vLLM's answer body for `call` (raising our errors for a bad call)."""
    body = call.body if isinstance(call.body, dict) else {}
    query = dict(call.query)
    op = call.op
    if op == "pause":
        mode = query.get("mode", "abort")
        if mode not in get_args(PauseMode):
            raise InvalidRequestError(f"mode must be one of {', '.join(get_args(PauseMode))}",
                                      param="mode")
        await engine.pause(mode)  # type: ignore[arg-type]
        # vLLM clears the prefix cache after a pause unless told not to (or keeping)
        if mode != "keep" and query.get("clear_cache", "true").lower() != "false":
            await engine.reset_prefix_cache()
        return {"status": "paused"}
    if op == "resume":
        await engine.resume()
        return {"status": "resumed"}
    if op == "is_paused":
        return {"is_paused": engine.paused is not None}
    if op == "update_weight_version":
        version = _string(body, "new_version", required=True)
        assert version is not None
        await engine.set_weight_version(version)
        return {"success": True, "new_version": version}
    if op == "weight_info":
        return {"weight_version": engine.weight_version}
    if op == "reset_prefix_cache":
        await engine.reset_prefix_cache()
        return {"success": True}
    if op == "is_sleeping":
        return {"is_sleeping": False}
    if op == "init_weight_transfer_engine":
        return {"message": "Weight transfer initialized"}
    if op == "start_weight_update":
        return {"message": "Weight update started"}
    if op == "update_weights":
        await _update(engine, body.get("update_info"))
        return {"message": "Weights updated"}
    if op == "finish_weight_update":
        version = _string(body, "weight_version", required=False)
        if version is not None:
            await engine.set_weight_version(version)
        return {"message": "Weight update finished"}
    if op in ("load_lora_adapter", "unload_lora_adapter"):
        raise UnsupportedParameterError(
            f"{op}: the embedded engine applies its adapters to every request (llama.cpp sets "
            "them per context, not per sequence): load them with update_weights "
            "(update_info.lora_path); adapters named per request are served in front of vLLM",
            param=op)
    if op == "collective_rpc":
        method = body.get("method")
        if method != "reload_weights":
            raise UnsupportedParameterError(
                f"collective_rpc method {method!r}: the embedded engine has no vLLM workers; "
                "it runs reload_weights (kwargs.weights_path: a GGUF) only", param="method")
        kwargs = body.get("kwargs") or {}
        await engine.load_weights(_file(kwargs.get("weights_path"), "kwargs.weights_path"))
        return {"results": [None]}
    raise UnsupportedParameterError(
        f"{op}: the embedded engine runs on the CPU and has no device memory to release",
        param=op)


async def answer(engine: Controlled, call: ControlCall) -> ControlAnswer:
    return ControlAnswer(REPLICA, 200, await _run(engine, call))

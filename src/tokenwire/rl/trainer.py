"""The trainer process behind Tinker's training API: LoRA policies in torch, one per training
model, served to the HTTP processes on a Unix socket (the embedded engine's frames,
engines/embedded/_wire.py).

    python -m tokenwire.rl.trainer SOCKET MODEL_DIR CHECKPOINT_DIR [SERVED_GGUF]

A request is `(op, body)`; the process answers `"queued"` as soon as it has the request in its
one queue, then the outcome (a dict, or a `Failure`). Operations run one at a time in arrival
order, as Tinker orders a model's calls (the SDK sends each only after the last one was
queued), in a thread of their own: sampling runs in other processes and never waits on a step.
A step that fails leaves the weights and the summed gradients as they were.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import pickle
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..engines.embedded._wire import Failure, frame, read_frame
from ..errors import (
    InvalidRequestError,
    NotFoundError,
    TokenwireError,
    UnsupportedParameterError,
    internal_error,
)
from ..serving.tinker.checkpoints import checkpoint_file, tinker_path
from .losses import CONFIG, LOSSES, READS, REQUIRED
from .policy import LoraSpec, Policy

__all__ = ["Trainer", "main"]

log = logging.getLogger("tokenwire.trainer")

_REFUSED_LOSSES = ("cispo", "dro", "gspo", "stable_reinforce", "custom")


EXPIRES = ".expires"
"""Beside a checkpoint saved with `ttl_seconds`: when it is to be deleted (epoch seconds)."""

MICRO_BATCH_TOKENS = 2048
"""Most padded tokens in one forward pass (its logits: 2048 x the vocabulary, 400 MB for
SmolLM2's 49,152 ids, kept with the graph until its backward)."""


def _micro_batches(data: list[tuple[torch.Tensor, dict[str, Any]]]
                   ) -> list[list[tuple[torch.Tensor, dict[str, Any]]]]:
    """The data in order, cut where one more datum would pad the batch past the budget."""
    parts: list[list[tuple[torch.Tensor, dict[str, Any]]]] = []
    width = 0
    for datum in data:
        n = len(datum[0])
        if parts and max(width, n) * (len(parts[-1]) + 1) <= MICRO_BATCH_TOKENS:
            parts[-1].append(datum)
            width = max(width, n)
        else:
            parts.append([datum])
            width = n
    return parts


class Trainer:
    def __init__(self, model_dir: Path, checkpoints: Path, served: Path | None = None):
        self._model_dir = model_dir
        self._root = checkpoints
        self._served = served
        """The GGUF the engine serves, for an untied copy (an unembedding adapter's base)."""
        self._models: dict[str, Policy] = {}
        self._saves: dict[str, int] = {}
        self._bases: dict[str, str] = {}
        self._seqs: dict[str, int] = {}

    def run(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        handler: Callable[[dict[str, Any]], dict[str, Any]] | None = getattr(
            self, f"op_{op}", None)
        if handler is None:
            raise UnsupportedParameterError(f"the trainer has no operation {op!r}", param="type")
        model_id, seq = body.get("model_id"), body.get("seq_id")
        if model_id in self._models and isinstance(seq, int) and seq > 0:
            # the SDK numbers a model's calls; one sent again (a retry after a lost answer)
            # must not sum its gradients or step twice
            if seq <= self._seqs.get(model_id, 0):
                raise InvalidRequestError(
                    f"seq_id {seq} of {model_id!r} was already run (the last: "
                    f"{self._seqs[model_id]})", param="seq_id", code="duplicate_id")
            self._seqs[model_id] = seq
        return handler(body)

    def _policy(self, model_id: str) -> Policy:
        policy = self._models.get(model_id)
        if policy is None:
            raise NotFoundError(f"no training model {model_id!r} on this server "
                                "(models live as long as the server's trainer process)",
                                param="model_id", code="model_not_found")
        return policy

    def _new(self, spec: LoraSpec, model_id: str) -> Policy:
        """A new model's policy (registered by `_add` once all of its making succeeded)."""
        if model_id in self._models:
            raise InvalidRequestError(f"training model {model_id!r} exists", param="model_seq_id",
                                      code="invalid_value")
        if not (spec.train_attn or spec.train_mlp or spec.train_unembed):
            raise InvalidRequestError("a LoRA trains attention, MLP or unembedding layers",
                                      param="lora_config", code="invalid_value")
        return Policy(self._model_dir, spec)

    def _add(self, model_id: str, policy: Policy, base: str) -> None:
        self._models[model_id] = policy
        self._bases[model_id] = base

    def op_create(self, body: dict[str, Any]) -> dict[str, Any]:
        model_id = body["model_id"]
        self._add(model_id, self._new(LoraSpec(**body["lora"]), model_id), body["base_model"])
        return {"model_id": model_id}

    def op_info(self, body: dict[str, Any]) -> dict[str, Any]:
        spec = self._policy(body["model_id"]).spec
        return {"model_id": body["model_id"], "lora_rank": spec.rank,
                "base_model": self._bases[body["model_id"]]}

    def op_forward_backward(self, body: dict[str, Any]) -> dict[str, Any]:
        policy = self._policy(body["model_id"])
        loss_name = body["loss_fn"]
        if loss_name in _REFUSED_LOSSES or loss_name not in LOSSES:
            raise UnsupportedParameterError(
                f"loss_fn {loss_name!r} is not served: tokenwire's trainer has "
                f"{', '.join(LOSSES)}", param="loss_fn")
        loss_fn, config = LOSSES[loss_name], body.get("loss_fn_config") or {}
        for key in config:
            if key not in CONFIG[loss_name]:
                raise UnsupportedParameterError(
                    f"loss {loss_name!r} takes no {key!r} in loss_fn_config"
                    + (f" ({', '.join(CONFIG[loss_name])})" if CONFIG[loss_name] else ""),
                    param=f"loss_fn_config.{key}")
        data = body["data"]
        if not data:
            raise InvalidRequestError("forward_backward needs at least one datum", param="data",
                                      code="invalid_value")
        tensors = [self._datum(policy, i, d, loss_name) for i, d in enumerate(data)]
        forward_only = bool(body.get("forward_only"))
        before = policy.grads()
        outputs, total = [], 0.0
        try:
            with torch.set_grad_enabled(not forward_only):
                # micro-batches' gradients summed as they go: the gradient of the batch's sum,
                # with one micro-batch's graph in memory at a time (64 data at once took 12 GB)
                for part in _micro_batches(tensors):
                    targets = policy.target_logprobs(
                        [(tokens, inputs["target_tokens"]) for tokens, inputs in part])
                    losses = [loss_fn(target, inputs, config)
                              for target, (_, inputs) in zip(targets, part, strict=True)]
                    for target, loss in zip(targets, losses, strict=True):
                        outputs.append({"logprobs": target.detach().numpy().astype(np.float32),
                                        "elementwise_loss":
                                            loss.detach().numpy().astype(np.float32)})
                        total += float(loss.detach().sum())
                    if not forward_only:
                        torch.stack([loss.sum() for loss in losses]).sum().backward()  # type: ignore[no-untyped-call]
        except Exception:
            policy.set_grads(before)  # nothing of a failed step is kept
            raise
        return {"outputs": outputs, "metrics": {"loss:sum": total}}

    @staticmethod
    def _datum(policy: Policy, i: int, d: dict[str, Any],
               loss: str) -> tuple[torch.Tensor, dict[str, Any]]:
        tokens = np.asarray(d["tokens"], dtype=np.int64)
        n = len(tokens)
        if n == 0:
            raise InvalidRequestError("a datum's model_input holds no token ids",
                                      param=f"data[{i}].model_input", code="invalid_value")
        if n > policy.max_len:
            raise InvalidRequestError(
                f"a datum of {n} tokens is longer than the model's context ({policy.max_len})",
                param=f"data[{i}].model_input", code="context_length_exceeded")
        vocab = policy.vocab_size
        if int(tokens.min()) < 0 or int(tokens.max()) >= vocab:
            raise InvalidRequestError(f"a token id outside the vocabulary (0..{vocab - 1})",
                                      param=f"data[{i}].model_input", code="invalid_token_id")
        inputs: dict[str, torch.Tensor] = {}
        for name in REQUIRED[loss]:
            if name not in d["inputs"]:
                raise InvalidRequestError(f"loss {loss!r} needs loss_fn_inputs[{name!r}]",
                                          param=f"data[{i}].loss_fn_inputs.{name}",
                                          code="missing_required_parameter")
        for name, value in d["inputs"].items():
            if name not in READS[loss]:
                raise UnsupportedParameterError(
                    f"loss {loss!r} reads {', '.join(READS[loss])}, not {name!r}",
                    param=f"data[{i}].loss_fn_inputs.{name}")
            arr = np.asarray(value).reshape(-1)
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise InvalidRequestError(f"loss_fn_inputs[{name!r}] holds NaN or infinity",
                                          param=f"data[{i}].loss_fn_inputs.{name}",
                                          code="invalid_value")
            if len(arr) != n:
                raise InvalidRequestError(
                    f"loss_fn_inputs[{name!r}] holds {len(arr)} values for {n} input tokens",
                    param=f"data[{i}].loss_fn_inputs.{name}", code="invalid_value")
            inputs[name] = torch.from_numpy(arr.astype(np.int64 if name == "target_tokens"
                                                       else np.float32))
        targets = inputs["target_tokens"]
        if int(targets.min()) < 0 or int(targets.max()) >= vocab:
            raise InvalidRequestError(f"a target id outside the vocabulary (0..{vocab - 1})",
                                      param=f"data[{i}].loss_fn_inputs.target_tokens",
                                      code="invalid_token_id")
        return torch.from_numpy(tokens), inputs

    def op_optim_step(self, body: dict[str, Any]) -> dict[str, Any]:
        policy = self._policy(body["model_id"])
        p = body["adam"]
        return {"metrics": policy.step(p["learning_rate"], p["beta1"], p["beta2"], p["eps"],
                                       p["weight_decay"], p["grad_clip_norm"])}

    def _name(self, model_id: str, name: str | None) -> str:
        if name:
            return name
        self._saves[model_id] = self._saves.get(model_id, 0) + 1
        return f"{self._saves[model_id]:06d}"

    def op_save(self, body: dict[str, Any]) -> dict[str, Any]:
        model_id, kind = body["model_id"], body["kind"]
        policy = self._policy(model_id)
        path = tinker_path(model_id, kind, self._name(model_id, body.get("name")))
        file = checkpoint_file(self._root, path)
        if file.exists() and not body.get("overwrite"):
            raise InvalidRequestError(f"{path} exists (overwrite=True replaces it)",
                                      param="path", code="invalid_value")
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
        if kind == "sampler_weights":
            policy.write_gguf(tmp)
        else:
            torch.save({**policy.state(), "base_model": self._bases[model_id]}, tmp)
        os.replace(tmp, file)
        expiry = file.with_name(file.name + EXPIRES)
        if body.get("ttl_seconds"):
            expiry.write_text(f"{time.time() + body['ttl_seconds']:.3f}\n")
        else:
            expiry.unlink(missing_ok=True)
        self.sweep()
        base = self._untied() if kind == "sampler_weights" and policy.unembeds else None
        return {"path": path, "file": str(file), "base": base}

    def sweep(self) -> None:
        """Checkpoints past their `ttl_seconds` deleted (at start, and at each save)."""
        now = time.time()
        for expiry in self._root.glob(f"*/*/*{EXPIRES}"):
            try:
                if float(expiry.read_text()) < now:
                    expiry.with_name(expiry.name.removesuffix(EXPIRES)).unlink(missing_ok=True)
                    expiry.unlink()
            except (OSError, ValueError):
                continue

    @functools.cache  # noqa: B019 - one Trainer a process; the served file does not change
    def _untied(self) -> str | None:
        """The served model with an output tensor of its own, made once per served file (None:
        the served model has one already); read from disk once a process."""
        import gguf

        from .lora import untie_gguf

        if self._served is None:
            raise UnsupportedParameterError(
                "an unembedding adapter on a served model this trainer was not told the file "
                "of", param="lora_config.train_unembed")
        reader = gguf.GGUFReader(str(self._served))
        if any(t.name == "output.weight" for t in reader.tensors):
            return None
        stat = self._served.stat()
        out = self._root / "_untied" / f"{self._served.stem}-{stat.st_size}-{stat.st_mtime_ns}.gguf"
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            untie_gguf(self._served, out)
        return str(out)

    def op_load(self, body: dict[str, Any]) -> dict[str, Any]:
        path = body["path"]
        file = checkpoint_file(self._root, path, kind="weights")
        if not file.is_file():
            raise NotFoundError(f"no checkpoint at {path}", param="path",
                                code="model_not_found")
        try:
            state = torch.load(file, weights_only=True)
            spec, base = LoraSpec(**state["spec"]), str(state["base_model"])
        except (KeyError, TypeError, RuntimeError, pickle.UnpicklingError) as exc:
            raise InvalidRequestError(f"{path} is not a tokenwire training checkpoint",
                                      param="path", code="invalid_value") from exc
        model_id = body.get("model_id")
        if model_id:
            policy = self._policy(model_id)
        else:
            model_id, policy = body["new_model_id"], self._new(spec, body["new_model_id"])
        try:
            policy.load(state, optimizer=bool(body.get("optimizer")))
        except (ValueError, KeyError, RuntimeError) as exc:
            raise InvalidRequestError(f"{path} does not fit this model: {exc}", param="path",
                                      code="invalid_value") from exc
        if model_id not in self._models:
            self._add(model_id, policy, base)
        return {"model_id": model_id, "path": path}


async def _serve(trainer: Trainer, sock: str) -> None:
    queue: asyncio.Queue[tuple[str, dict[str, Any], asyncio.StreamWriter]] = asyncio.Queue()

    # one thread runs every operation: torch's memory stays in one malloc arena (a thread per
    # call left each its own, and the process's resident memory grew with them)
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer")

    async def work() -> None:
        loop = asyncio.get_running_loop()
        while True:
            op, body, writer = await queue.get()
            try:
                answer = frame(await loop.run_in_executor(thread, trainer.run, op, body))
            except TokenwireError as exc:
                answer = frame(Failure.of(exc))
            except Exception as exc:  # noqa: BLE001 - the caller's future says so
                log.exception("trainer operation %s failed", op)
                answer = frame(Failure.of(internal_error(f"the trainer's {op}", exc)))
            try:
                writer.write(answer)
                await writer.drain()
            except Exception:  # noqa: BLE001 - the asker is gone; the step ran all the same
                pass
            finally:
                writer.close()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            op, body = await read_frame(reader)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, TypeError):
            writer.close()
            return
        await queue.put((op, body, writer))
        writer.write(frame("queued"))
        await writer.drain()

    async def orphaned() -> None:
        """The trainer lives as long as the worker that started it: a server killed outright
        (SIGKILL) cannot stop it, so it stops itself (as the engine process does)."""
        parent = os.getppid()
        while os.getppid() == parent:
            await asyncio.sleep(1.0)
        log.warning("the server that started the trainer is gone: stopping")

    worker = asyncio.create_task(work())
    server = await asyncio.start_unix_server(accept, path=sock)
    async with server:
        done, _ = await asyncio.wait([asyncio.create_task(server.serve_forever()), worker,
                                      asyncio.create_task(orphaned())],
                                     return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not worker or task.cancelled():
                continue
            task.result()  # a failure of the queue's loop is the process's


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    sock, model_dir, checkpoints = args[:3]
    served = Path(args[3]) if len(args) > 3 else None
    logging.basicConfig(level=os.environ.get("TOKENWIRE_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s trainer %(levelname)s %(message)s")
    trainer = Trainer(Path(model_dir), Path(checkpoints), served)
    trainer.sweep()
    asyncio.run(_serve(trainer, sock))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

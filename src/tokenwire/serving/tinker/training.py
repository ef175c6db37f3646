"""Tinker's training API on tokenwire: the calls go to a trainer process beside the server
(rl/trainer.py: torch, the `rl` extra), each answered at once with a future that every worker
reads (futures.py), as samples are.

The trainer process is started by the first worker that needs it (trainer_process.py) and
listens on a socket in the run directory, so every worker of the box reaches the same models.
A call is answered only once the trainer has it in its queue: the SDK sends a model's next call
after the last one was answered, so the trainer runs them in the order they were made.

`save_weights_for_sampler` writes the adapter as llama.cpp's GGUF LoRA and serves it on the
embedded engine (pause, update_weights with the checkpoint's path as the weight version,
resume; an unembedding adapter of a model that ties its embeddings first loads the model's
untied copy, the trainer's `_untied`): the engine holds one set of weights at a time, so a
sampler of an older checkpoint is refused by name rather than sampled with other weights.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...config import Settings
from ...engines.base import ControlCall
from ...errors import (
    EngineError,
    InvalidRequestError,
    TokenwireError,
    UnsupportedParameterError,
    internal_error,
)
from ...protocol.tinker import (
    CreateModel,
    InfoAnswer,
    LoadWeights,
    ModelData,
    OptimStep,
    SaveWeights,
    SaveWeightsForSampler,
    UntypedFuture,
)
from ..models import ModelRegistry, ServedModel
from .checkpoints import checkpoint_file
from .futures import FutureBox
from .trainer_process import TrainerProcess
from .wire import forward_backward_output

__all__ = ["TrainingService"]

log = logging.getLogger(__name__)

_JSON = {"content-type": "application/json"}

Encode = Callable[[dict[str, Any]], tuple[bytes, dict[str, str]]]


def _model_id(session_id: str, seq: int) -> str:
    """A training model's id, as the SDK derives it too (`create_training_client_from_state`
    knows it before the server answers); also the run in its checkpoints' `tinker://` paths."""
    return f"{session_id}:train:{seq}"


def _json(answer: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    return json.dumps(answer).encode(), dict(_JSON)


class TrainingService:
    def __init__(self, models: ModelRegistry, settings: Settings, box: FutureBox):
        self._models = models
        self._settings = settings
        self._box = box
        self._trainer: TrainerProcess | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._swap = asyncio.Lock()

    # -- what may be trained -----------------------------------------------------------------

    def _ready(self) -> TrainerProcess:
        model_dir = self._settings.trainer_model
        if model_dir is None:
            raise UnsupportedParameterError(
                "Tinker's training API is not served here: start the server with "
                "--trainer-model DIR (the served model's Hugging Face directory) and the `rl` "
                "extra installed", param="type")
        if importlib.util.find_spec("torch") is None or \
                importlib.util.find_spec("transformers") is None:
            raise UnsupportedParameterError(
                "Tinker's training API needs the `rl` extra on the server "
                "(pip install 'tokenwire[rl]')", param="type")
        if self._trainer is None:
            served = self._settings.model_path() if self._settings.engine == "embedded" \
                else None
            self._trainer = TrainerProcess(model_dir, self._settings.checkpoint_dir, served)
        return self._trainer

    @property
    def socket(self) -> str:
        """The trainer process's socket (it names the process: the tests' fault injection)."""
        return self._ready().socket

    def trainable(self) -> ServedModel | None:
        """The model the trainer adapts: the first one served (its weights are the
        `trainer_model` directory)."""
        if self._settings.trainer_model is None:
            return None
        served = self._models.all()
        return served[0] if served else None

    def _base(self, name: str, param: str) -> ServedModel:
        """A served model by its id, or the trainable one by its `--trainer-model` directory:
        tinker-cookbook's recipes name the base model as they load its tokenizer (a local
        directory where there is no hub)."""
        trainable = self.trainable()
        model_dir = self._settings.trainer_model
        if trainable is not None and model_dir is not None and name.startswith("/") and \
                Path(name).resolve() == model_dir.resolve():
            return trainable
        model = self._models.get(name, param=param)
        if trainable is None or model.id != trainable.id:
            raise UnsupportedParameterError(
                f"{name!r} is served for sampling only: the trainer adapts "
                f"{trainable.id if trainable else 'no model'}", param=param)
        return model

    # -- calls -------------------------------------------------------------------------------

    async def _submit(self, op: str, body: dict[str, Any], encode: Encode,
                      model_id: str | None) -> UntypedFuture:
        return self._future(op, await self._ready().submit(op, body), encode, model_id)

    def _future(self, op: str, outcome: asyncio.Future[Any], encode: Encode,
                model_id: str | None) -> UntypedFuture:
        """A future in the box for `outcome`, settled (encoded, or failed) when it is."""
        fid = self._box.new()
        task = asyncio.create_task(self._settle(fid, op, outcome, encode))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return UntypedFuture(request_id=fid, model_id=model_id, sample_sequence_ids=[])

    async def _settle(self, fid: str, op: str, outcome: asyncio.Future[Any],
                      encode: Encode) -> None:
        try:
            payload, headers = encode(await outcome)
        except TokenwireError as exc:
            self._box.fail_with(fid, exc)
        except asyncio.CancelledError:
            self._box.fail(fid, f"the server shut down before {op} finished", "server")
            raise
        except Exception as exc:  # noqa: BLE001 - reported on the future, never left pending
            log.exception("a Tinker %s failed", op)
            self._box.fail(fid, internal_error(f"the server's {op}", exc).message, "server")
        else:
            self._box.finish(fid, payload, headers)

    async def create_model(self, req: CreateModel) -> UntypedFuture:
        base = self._base(req.base_model, "base_model")
        if req.lora_config is None:
            raise UnsupportedParameterError("a model without lora_config (full fine-tuning) "
                                            "is not served: LoRA only", param="lora_config")
        optimizer = (req.optimizer_config or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise UnsupportedParameterError(f"optimizer {optimizer!r}: AdamW only",
                                            param="optimizer_config.type")
        lora = req.lora_config.model_dump()
        return await self._submit(
            "create", {"lora": lora, "base_model": base.id,
                       "model_id": _model_id(req.session_id, req.model_seq_id)},
            lambda a: _json({"model_id": a["model_id"], "type": "create_model"}), None)

    async def info(self, model_id: str) -> InfoAnswer:
        trainer = self._ready()
        answer = await (await trainer.submit("info", {"model_id": model_id}))
        return InfoAnswer(
            model_id=model_id, lora_rank=answer["lora_rank"], model_name=answer["base_model"],
            model_data=ModelData(arch="llama", model_name=answer["base_model"],
                                 tokenizer_id=str(self._settings.trainer_model)))

    async def forward_backward(self, body: dict[str, Any]) -> UntypedFuture:
        def encode(a: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
            return forward_backward_output(a["outputs"], a["metrics"]), \
                {"content-type": "application/x-protobuf"}

        return await self._submit("forward_backward", body, encode, body["model_id"])

    async def optim_step(self, req: OptimStep) -> UntypedFuture:
        if req.optimizer_params is not None or req.adam_params is None:
            raise UnsupportedParameterError("optimizer_params: the trainer steps with AdamW "
                                            "(adam_params)", param="optimizer_params")
        return await self._submit(
            "optim_step", {"model_id": req.model_id, "seq_id": req.seq_id,
                           "adam": req.adam_params.model_dump()},
            lambda a: _json({"metrics": a["metrics"]}), req.model_id)

    async def save_weights(self, req: SaveWeights) -> UntypedFuture:
        return await self._submit(
            "save", {"model_id": req.model_id, "seq_id": req.seq_id, "kind": "weights",
                     "name": req.path, "overwrite": req.overwrite,
                     "ttl_seconds": req.ttl_seconds},
            lambda a: _json({"path": a["path"], "type": "save_weights"}), req.model_id)

    async def load_weights(self, req: LoadWeights) -> UntypedFuture:
        checkpoint_file(self._settings.checkpoint_dir, req.path, kind="weights")  # a 400 now
        if req.optimizer_config is not None and req.optimizer_config.get("type") != "adamw":
            raise UnsupportedParameterError("optimizer_config: AdamW only",
                                            param="optimizer_config.type")
        if req.weights_access_token is not None:
            raise UnsupportedParameterError(
                "weights_access_token: checkpoints are this server's own files",
                param="weights_access_token")
        new = None
        if req.model_id is None:
            if req.session_id is None or req.model_seq_id is None:
                raise InvalidRequestError("load_weights names a model_id, or the session_id and "
                                          "model_seq_id of a new one", param="model_id",
                                          code="missing_required_parameter")
            if req.base_model is not None:
                self._base(req.base_model, "base_model")
            new = _model_id(req.session_id, req.model_seq_id)
        return await self._submit(
            "load", {"model_id": req.model_id, "seq_id": req.seq_id, "new_model_id": new,
                     "path": req.path, "optimizer": req.optimizer},
            lambda a: _json({"path": a["path"], "model_id": a["model_id"],
                             "type": "load_weights"}), req.model_id)

    async def save_weights_for_sampler(self, req: SaveWeightsForSampler,
                                       sampler_id: Callable[[str, str], str]) -> UntypedFuture:
        if req.kind != "snapshot":
            raise UnsupportedParameterError(
                "kind 'inflight': the embedded engine serves one set of weights at a time, "
                "each save a snapshot", param="kind")
        model = self.trainable()
        if model is None or self._settings.engine != "embedded":
            raise UnsupportedParameterError(
                "save_weights_for_sampler serves the adapter on the embedded engine; a "
                "gateway's fleet takes adapters by load_lora_adapter (PEFT) and that path is "
                "not built for Tinker's checkpoints yet", param="type")
        trainer = self._ready()
        outcome = await trainer.submit(
            "save", {"model_id": req.model_id, "seq_id": req.seq_id, "kind": "sampler_weights",
                     "name": req.path, "ttl_seconds": req.ttl_seconds})

        async def served() -> dict[str, Any]:
            saved: dict[str, Any] = await outcome
            async with self._swap:  # one swap of the engine's weights at a time (this worker's)
                await self._serve_adapter(model, Path(saved["file"]), saved["path"],
                                          saved["base"])
            return saved

        named = req.path is not None
        return self._future(
            "save_weights_for_sampler", asyncio.ensure_future(served()),
            lambda a: _json({"path": a["path"], "type": "save_weights_for_sampler"} if named
                            else {"sampling_session_id": sampler_id(model.id, a["path"]),
                                  "type": "save_weights_for_sampler"}), req.model_id)

    @staticmethod
    async def _serve_adapter(model: ServedModel, file: Path, version: str,
                             base: str | None) -> None:
        """The adapter on the engine, its weight version the checkpoint's path; first the
        untied copy of the model where the adapter adapts the output layer (`base`)."""
        async def call(op: str, query: tuple[tuple[str, str], ...] = (),
                       body: dict[str, Any] | None = None) -> None:
            for answer in await model.engine.control(ControlCall(op, query, body)):
                if not answer.ok:
                    raise EngineError(f"{op} on {answer.replica}: {answer.body}")

        try:
            await call("pause", (("mode", "wait"),))
            if base is not None:
                await call("update_weights", (), {"update_info": {"weights_path": base}})
            await call("update_weights", (), {
                "update_info": {"lora_path": str(file), "weight_version": version}})
            await call("reset_prefix_cache")
        finally:
            await call("resume")

    async def served_version(self, model: ServedModel) -> str | None:
        answers = await model.engine.control(ControlCall("weight_info"))
        versions = {a.body.get("weight_version") for a in answers if isinstance(a.body, dict)}
        return versions.pop() if len(versions) == 1 else None

    def sampler_file(self, path: str, param: str) -> Path:
        file = checkpoint_file(self._settings.checkpoint_dir, path, param=param,
                               kind="sampler_weights")
        if not file.is_file():
            raise InvalidRequestError(f"no sampler weights at {path}", param=param,
                                      code="model_not_found")
        return file

    async def aclose(self) -> None:
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        if self._trainer is not None:
            await self._trainer.aclose()

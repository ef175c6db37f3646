"""Tinker's sampling API on tokenwire: the official SDK's sessions, sampling sessions, `asample`
and its futures, answered from the same engine call as `/inference/v1/generate`.

A sample is planned (checked) before `asample` answers, so bad input is a 400 naming the field
in Tinker's terms; it then runs as a task of this worker, and its outcome goes to the box of
futures every worker reads (futures.py). A sampling session's id names its model, so any
worker resolves it without shared state; a session is an id and its heartbeats (nothing a
sample depends on). A sampler of trained weights (a `tinker://` sampler path, training.py)
names its path in its id too, and samples only while the engine serves those weights. What
tokenwire cannot honour is refused by name: images and other non-token chunks,
`target_prompt_logprobs`, `prompt_alt_tokens_k`, `record_stability_info`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import uuid
from collections.abc import Sequence

from ...config import Settings
from ...errors import (
    InvalidRequestError,
    NotFoundError,
    TokenwireError,
    UnsupportedParameterError,
)
from ...protocol.generate import GenerateRequest
from ...protocol.tinker import (
    CreateSamplingSession,
    CreateSamplingSessionAnswer,
    CreateSessionAnswer,
    SampleRequest,
    SamplerInfo,
    ServerCapabilities,
    SupportedModel,
    UntypedFuture,
)
from ..generate import GenerateService
from ..generation import wire_spans
from ..models import ModelRegistry, ServedModel
from ..service import ANONYMOUS, Caller, Plan
from .futures import Failed, Finished, FutureBox, Pending
from .training import TrainingService
from .wire import sample_response

__all__ = ["TinkerService", "sampler_id"]

log = logging.getLogger(__name__)

_SAMPLER = "tw-sampler"


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def sampler_id(model: str, path: str | None = None) -> str:
    """A sampling session's id: unique, and naming its model and the sampler path of its
    weights, if any (base64url has no '.')."""
    return ".".join([_SAMPLER, uuid.uuid4().hex, _b64(model), *([_b64(path)] if path else [])])


def _of_sampler(sampler_id: str) -> tuple[str, str | None] | None:
    """(model, sampler path) of a sampling session's id."""
    parts = sampler_id.split(".")
    if len(parts) not in (3, 4) or parts[0] != _SAMPLER:
        return None
    try:
        named = [base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)).decode() for p in parts[2:]]
    except (binascii.Error, UnicodeDecodeError):
        return None
    return named[0], named[1] if len(named) > 1 else None


def _tinker_param(param: str | None, offsets: Sequence[int]) -> str | None:
    """A generate field's name in the Tinker request it was made from."""
    if param is None:
        return None
    if param.startswith("token_ids["):
        at = int(param[len("token_ids["):param.index("]")])
        chunk = max(i for i, start in enumerate(offsets) if start <= at)
        return f"prompt.chunks[{chunk}].tokens[{at - offsets[chunk]}]{param[param.index(']') + 1:]}"
    renamed = {"token_ids": "prompt", "sampling_params.n": "num_samples",
               "sampling_params.logprobs": "topk_sample_logprobs",
               "sampling_params.prompt_logprobs": "topk_prompt_logprobs",
               "sampling_params.stop_token_ids": "sampling_params.stop"}
    for old, new in renamed.items():
        if param == old or param.startswith((f"{old}[", f"{old}.")):
            return new + param[len(old):]
    return param


class TinkerService:
    def __init__(self, models: ModelRegistry, generate: GenerateService, settings: Settings,
                 box: FutureBox | None = None):
        self._models = models
        self._generate = generate
        self._box = box or FutureBox()
        self.training = TrainingService(models, settings, self._box)
        self._running: set[asyncio.Task[None]] = set()

    def capabilities(self) -> ServerCapabilities:
        trainable = self.training.trainable()
        return ServerCapabilities(supported_models=[
            SupportedModel(model_name=m.id, max_context_length=m.max_model_len,
                           trainable=trainable is not None and m.id == trainable.id)
            for m in self._models.all()])

    @staticmethod
    def create_session() -> CreateSessionAnswer:
        return CreateSessionAnswer(session_id=f"tw-session-{uuid.uuid4().hex}")

    def _trained(self, path: str, param: str) -> ServedModel:
        """The model whose trained weights `path` names (a checkpoint on the server's disk)."""
        self.training.sampler_file(path, param)
        model = self.training.trainable()
        if model is None:
            raise NotFoundError(f"no sampler at {path!r}: this server trains no model",
                                param=param, code="model_not_found")
        return model

    def create_sampling_session(self, body: CreateSamplingSession) -> CreateSamplingSessionAnswer:
        if body.model_path is not None:
            model = self._trained(body.model_path, "model_path")
            return CreateSamplingSessionAnswer(
                sampling_session_id=sampler_id(model.id, body.model_path))
        if body.base_model is None:
            raise InvalidRequestError("Missing required parameter: 'base_model'.",
                                      param="base_model", code="missing_required_parameter")
        model = self._models.get(body.base_model, param="base_model")
        return CreateSamplingSessionAnswer(sampling_session_id=sampler_id(model.id))

    def sampler(self, sid: str) -> SamplerInfo:
        named = _of_sampler(sid)
        if named is None:
            raise NotFoundError(f"no sampling session {sid!r}", param="sampler_id")
        model = self._models.get(named[0], param="sampler_id")
        return SamplerInfo(sampler_id=sid, base_model=model.id, model_path=named[1])

    def _model(self, req: SampleRequest) -> tuple[ServedModel, str | None]:
        """The model sampled, and the sampler path of the weights it must be serving."""
        if req.model_path is not None:
            return self._trained(req.model_path, "model_path"), req.model_path
        if req.sampling_session_id is not None:
            named = _of_sampler(req.sampling_session_id)
            if named is None:
                raise NotFoundError(f"no sampling session {req.sampling_session_id!r}",
                                    param="sampling_session_id")
            return self._models.get(named[0], param="sampling_session_id"), named[1]
        if req.base_model is not None:
            return self._models.get(req.base_model, param="base_model"), None
        raise InvalidRequestError("a sample names its sampling_session_id (or base_model)",
                                  param="sampling_session_id",
                                  code="missing_required_parameter")

    async def _check_weights(self, model: ServedModel, path: str, param: str) -> None:
        """A sampler of trained weights samples only while the engine serves them."""
        served = await self.training.served_version(model)
        if served != path:
            raise InvalidRequestError(
                f"the engine now serves {served!r}, not {path}: it holds one set of weights "
                "at a time (the last save_weights_for_sampler); save these again to sample "
                "them", param=param, code="weights_not_served")

    @staticmethod
    def _refuse(req: SampleRequest) -> None:
        if req.target_prompt_logprobs is not None:
            raise UnsupportedParameterError(
                "target_prompt_logprobs is not supported: prompt logprobs are the prompt's own "
                "ids' (prompt_logprobs) and the most likely ones (topk_prompt_logprobs)",
                param="target_prompt_logprobs")
        if req.prompt_alt_tokens_k:
            raise UnsupportedParameterError("prompt_alt_tokens_k is not supported",
                                            param="prompt_alt_tokens_k")
        if req.record_stability_info:
            raise UnsupportedParameterError("record_stability_info is not supported",
                                            param="record_stability_info")
        if req.prompt_logprobs_last_n is not None and not (req.prompt_logprobs
                                                           or req.topk_prompt_logprobs):
            raise InvalidRequestError("prompt_logprobs_last_n needs prompt_logprobs",
                                      param="prompt_logprobs_last_n", code="invalid_value")
        for i, chunk in enumerate(req.prompt.chunks):
            if chunk.type != "encoded_text" or chunk.tokens is None:
                raise UnsupportedParameterError(
                    f"a prompt chunk of type {chunk.type!r}: tokenwire samples from token ids "
                    "(encoded_text chunks) only", param=f"prompt.chunks[{i}].type")

    @staticmethod
    def _generate_request(req: SampleRequest, model: ServedModel) -> GenerateRequest:
        """The `/inference/v1/generate` request that samples the same ids."""
        sp = req.sampling_params
        stop = [sp.stop] if isinstance(sp.stop, str) else sp.stop
        strings = [s for s in stop or () if isinstance(s, str)]
        ids = [s for s in stop or () if isinstance(s, int)]
        k_prompt = req.topk_prompt_logprobs if req.prompt_logprobs or req.topk_prompt_logprobs \
            else None
        return GenerateRequest.model_validate({
            "model": model.id,
            "token_ids": [t for c in req.prompt.chunks for t in c.tokens or ()],
            "sampling_params": {
                "n": req.num_samples, "temperature": sp.temperature, "top_p": sp.top_p,
                "top_k": max(sp.top_k, 0), "seed": sp.seed, "max_tokens": sp.max_tokens,
                "stop": strings or None, "stop_token_ids": ids or None,
                "ignore_eos": stop == [],  # Tinker: an empty list stops at nothing
                "logprobs": req.topk_sample_logprobs, "prompt_logprobs": k_prompt}})

    async def asample(self, req: SampleRequest, caller: Caller = ANONYMOUS) -> UntypedFuture:
        """Check and plan the sample, start it, and answer its future's id."""
        model, path = self._model(req)
        self._refuse(req)
        if path is not None:
            await self._check_weights(model, path, "model_path" if req.model_path
                                      else "sampling_session_id")
        offsets, at = [], 0
        for c in req.prompt.chunks:
            offsets.append(at)
            at += len(c.tokens or ())
        if at == 0:
            raise InvalidRequestError("the prompt holds no token ids", param="prompt",
                                      code="invalid_value")
        try:
            gen = self._generate_request(req, model)
            plan = await self._generate.planned(gen, caller)
        except TokenwireError as exc:
            exc.param = _tinker_param(exc.param, offsets)
            raise
        fid = self._box.new()
        task = asyncio.create_task(self._run(fid, plan, req, path))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return UntypedFuture(request_id=fid, model_id=model.id,
                             sample_sequence_ids=[f"{fid}:{i}" for i in range(req.num_samples)])

    async def _run(self, fid: str, plan: Plan, req: SampleRequest, path: str | None) -> None:
        ids = [t for c in req.prompt.chunks for t in c.tokens or ()]
        try:
            results = await self._generate.finished(plan)
            payload = sample_response(
                ids, results, prompt_logprobs=req.prompt_logprobs,
                topk_prompt=req.topk_prompt_logprobs, last_n=req.prompt_logprobs_last_n,
                topk_sample=req.topk_sample_logprobs)
        except TokenwireError as exc:
            self._box.fail_with(fid, exc)
            return
        except asyncio.CancelledError:
            self._box.fail(fid, "the server shut down before the sample finished", "server")
            raise
        except Exception as exc:  # noqa: BLE001 - reported on the future, never left pending
            log.exception("a Tinker sample failed")
            self._box.fail(fid, f"internal error: {exc!r}", "server")
            return
        spans = [[s.model_dump() for s in wire_spans(r.weight_versions) or []]
                 for r in results]
        if path is not None and any(s["version"] != path for seq in spans for s in seq):
            # checked at asample, and again here: a save for the sampler may have swapped the
            # engine's weights in between
            self._box.fail(fid, f"the engine's weights changed from {path} during the sample "
                           "(another save_weights_for_sampler): sample again from the newest "
                           "(weights_not_served)", "user")
            return
        self._box.finish(fid, payload, {
            "x-tokenwire-tokenizer-version": plan.space.client.version,
            "x-tokenwire-weight-versions": json.dumps(spans, separators=(",", ":"))})

    async def retrieve(self, fid: str, wait: float) -> Finished | Failed | Pending:
        if not self._box.known(fid):
            return Failed(f"no future {fid!r} on this server", "user")
        return await self._box.wait(fid, wait)

    async def aclose(self) -> None:
        await self.training.aclose()
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        self._box.close()

"""Tinker's sampling API on tokenwire: the official SDK's sessions, sampling sessions, `asample`
and its futures, answered from the same engine call as `/inference/v1/generate`.

A sample is planned (checked) before `asample` answers, so bad input is a 400 naming the field
in Tinker's terms; it then runs as a task of this worker, and its outcome goes to the box of
futures every worker reads (futures.py). A sampling session's id names its model, so any
worker resolves it without shared state; a session is an id and its heartbeats (nothing a
sample depends on). What tokenwire cannot honour is refused by name: images and other
non-token chunks, `target_prompt_logprobs`, `prompt_alt_tokens_k`, `record_stability_info`,
a `tinker://` sampler path (training is not served).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import uuid
from collections.abc import Sequence

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
from .wire import sample_response

__all__ = ["TinkerService"]

log = logging.getLogger(__name__)

_SAMPLER = "tw-sampler"


def _sampler_id(model: str) -> str:
    """A sampling session's id: unique, and naming its model (base64url has no '.')."""
    name = base64.urlsafe_b64encode(model.encode()).decode().rstrip("=")
    return f"{_SAMPLER}.{uuid.uuid4().hex}.{name}"


def _model_of_sampler(sampler_id: str) -> str | None:
    parts = sampler_id.split(".")
    if len(parts) != 3 or parts[0] != _SAMPLER:
        return None
    try:
        return base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


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
    def __init__(self, models: ModelRegistry, generate: GenerateService,
                 box: FutureBox | None = None):
        self._models = models
        self._generate = generate
        self._box = box or FutureBox()
        self._running: set[asyncio.Task[None]] = set()

    def capabilities(self) -> ServerCapabilities:
        return ServerCapabilities(supported_models=[
            SupportedModel(model_name=m.id, max_context_length=m.max_model_len)
            for m in self._models.all()])

    @staticmethod
    def create_session() -> CreateSessionAnswer:
        return CreateSessionAnswer(session_id=f"tw-session-{uuid.uuid4().hex}")

    def create_sampling_session(self, body: CreateSamplingSession) -> CreateSamplingSessionAnswer:
        if body.model_path is not None:
            raise NotFoundError(
                f"no sampler at {body.model_path!r}: tokenwire samples its served models by "
                "name (base_model); Tinker's training and its tinker:// paths are not served",
                param="model_path", code="model_not_found")
        if body.base_model is None:
            raise InvalidRequestError("Missing required parameter: 'base_model'.",
                                      param="base_model", code="missing_required_parameter")
        model = self._models.get(body.base_model, param="base_model")
        return CreateSamplingSessionAnswer(sampling_session_id=_sampler_id(model.id))

    def sampler(self, sampler_id: str) -> SamplerInfo:
        name = _model_of_sampler(sampler_id)
        if name is None:
            raise NotFoundError(f"no sampling session {sampler_id!r}", param="sampler_id")
        model = self._models.get(name, param="sampler_id")
        return SamplerInfo(sampler_id=sampler_id, base_model=model.id)

    def _model(self, req: SampleRequest) -> ServedModel:
        if req.model_path is not None:
            raise NotFoundError(f"no sampler at {req.model_path!r} (training is not served)",
                                param="model_path", code="model_not_found")
        if req.sampling_session_id is not None:
            name = _model_of_sampler(req.sampling_session_id)
            if name is None:
                raise NotFoundError(f"no sampling session {req.sampling_session_id!r}",
                                    param="sampling_session_id")
            return self._models.get(name, param="sampling_session_id")
        if req.base_model is not None:
            return self._models.get(req.base_model, param="base_model")
        raise InvalidRequestError("a sample names its sampling_session_id (or base_model)",
                                  param="sampling_session_id",
                                  code="missing_required_parameter")

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
        model = self._model(req)
        self._refuse(req)
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
        task = asyncio.create_task(self._run(fid, plan, req))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return UntypedFuture(request_id=fid, model_id=model.id,
                             sample_sequence_ids=[f"{fid}:{i}" for i in range(req.num_samples)])

    async def _run(self, fid: str, plan: Plan, req: SampleRequest) -> None:
        ids = [t for c in req.prompt.chunks for t in c.tokens or ()]
        try:
            results = await self._generate.finished(plan)
            payload = sample_response(
                ids, results, prompt_logprobs=req.prompt_logprobs,
                topk_prompt=req.topk_prompt_logprobs, last_n=req.prompt_logprobs_last_n,
                topk_sample=req.topk_sample_logprobs)
        except TokenwireError as exc:
            said = f"{exc.message} ({exc.param})" if exc.param else exc.message
            # a full queue is the server's moment, not the request's fault: the SDK sends it
            # again (a 410 on its future); other refusals are the request's, failures ours
            category = "retry" if exc.status_code == 429 else \
                "user" if exc.status_code < 500 else "server"
            self._box.fail(fid, said, category)
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
        self._box.finish(fid, payload, {
            "x-tokenwire-tokenizer-version": plan.space.client.version,
            "x-tokenwire-weight-versions": json.dumps(spans, separators=(",", ":"))})

    async def retrieve(self, fid: str, wait: float) -> Finished | Failed | Pending:
        if not self._box.known(fid):
            return Failed(f"no future {fid!r} on this server", "user")
        return await self._box.wait(fid, wait)

    async def aclose(self) -> None:
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        self._box.close()

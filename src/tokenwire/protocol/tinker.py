"""Tinker's API, as the official `tinker` SDK (0.38) speaks it: its JSON bodies, read from the
SDK's own `types/` (a finished sample or forward pass, and the training batch itself, are
protobuf: `tinker.proto.tinker_public_pb2`, serving/tinker/wire.py); docs/api/tinker.md says
what is served."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, StrictInt, Tag

from ._base import RequestModel, ResponseModel
from .common import TokenId

__all__ = [
    "AdamParams",
    "ClientConfig",
    "CreateModel",
    "GetInfo",
    "InfoAnswer",
    "LoadWeights",
    "LoraConfig",
    "ModelData",
    "OptimStep",
    "SaveWeights",
    "SaveWeightsForSampler",
    "CreateSamplingSession",
    "CreateSamplingSessionAnswer",
    "CreateSession",
    "CreateSessionAnswer",
    "DynamicConfig",
    "FutureRequest",
    "ModelInput",
    "ModelInputChunk",
    "RequestFailed",
    "SampleRequest",
    "SamplerInfo",
    "ServerCapabilities",
    "SessionCall",
    "SupportedModel",
    "TinkerSamplingParams",
    "TryAgain",
    "UntypedFuture",
]


class _Loose(RequestModel):
    """A bookkeeping body (config, sessions): the SDK adds fields to these over its releases
    and none of them changes what is sampled, so fields we do not read are let through."""

    model_config = ConfigDict(extra="allow", strict=True)


class SdkVersion(_Loose):
    sdk_version: str | None = None


class CreateSession(_Loose):
    tags: list[str] = []
    user_metadata: dict[str, Any] = {}
    sdk_version: str | None = None
    project_id: str | None = None
    display_name: str | None = None
    type: Literal["create_session"] = "create_session"


class SessionCall(_Loose):
    """A heartbeat (`session_heartbeat`), or anything else that names a session."""

    session_id: str | None = None
    type: str | None = None


class CreateSamplingSession(_Loose):
    session_id: str
    sampling_session_seq_id: int = 0
    base_model: str | None = None
    model_path: str | None = None
    type: Literal["create_sampling_session"] = "create_sampling_session"


class ModelInputChunk(RequestModel):
    """One chunk of a prompt: `encoded_text` (token ids) is what tokenwire samples from; the
    SDK's other kinds (`image`, `image_asset_pointer`, `dmel`) are refused by name."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str = "encoded_text"
    tokens: list[TokenId] | None = None


class ModelInput(RequestModel):
    chunks: list[ModelInputChunk]


def _stop_tag(v: Any) -> str | None:
    """Union tags start with "~" so that error locations drop them (api/validation.py)."""
    if isinstance(v, str):
        return "~str"
    if isinstance(v, list):
        return "~strs" if all(isinstance(s, str) for s in v) else "~ids"
    return None


Stop = Annotated[
    Annotated[str, Tag("~str")] | Annotated[list[str], Tag("~strs")]
    | Annotated[list[TokenId], Tag("~ids")],
    Discriminator(_stop_tag, custom_error_type="invalid_type",
                  custom_error_message="stop must be a string, strings, or token ids")]


class TinkerSamplingParams(RequestModel):
    """Tinker's `SamplingParams`: `stop` as strings or as token ids; None keeps the model's
    end-of-generation ids, `[]` stops at nothing (not even those)."""

    max_tokens: Annotated[int, Field(ge=1)] | None = None
    seed: int | None = None
    stop: Stop | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_k: StrictInt = -1
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0


class SampleRequest(RequestModel):
    """`POST /api/v1/asample`: the SDK's `SampleRequest`, every field it sends."""

    num_samples: Annotated[int, Field(ge=1)] = 1
    prompt: ModelInput
    sampling_params: TinkerSamplingParams
    base_model: str | None = None
    model_path: str | None = None
    sampling_session_id: str | None = None
    seq_id: int | None = None
    prompt_logprobs: bool = False
    topk_prompt_logprobs: Annotated[int, Field(ge=0, le=20)] = 0
    topk_sample_logprobs: Annotated[int, Field(ge=0, le=20)] = 0
    target_prompt_logprobs: Any = None
    prompt_alt_tokens_k: Annotated[int, Field(ge=0)] = 0
    prompt_logprobs_last_n: Annotated[int, Field(ge=1)] | None = None
    record_stability_info: bool = False
    type: Literal["sample"] = "sample"


class FutureRequest(RequestModel):
    """`POST /api/v1/retrieve_future` (and `cancel_future`)."""

    request_id: str
    allow_metadata_only: bool = False


class ClientConfig(ResponseModel):
    """`POST /api/v1/client/config`: no JWT exchange (the key is checked as it comes), futures
    polled one by one (`retrieve_future`, long-polled), httpx as the SDK's transport."""

    pjwt_auth_enabled: bool = False
    sample_use_retrieve_futures: bool = False
    use_pyqwest_transport: bool = False
    parallel_fwdbwd_chunks: bool = False
    """A batch's chunks one after another, so gradients sum in one order (repeatable)."""
    proto_compress_fwdbwd: bool = False
    """Batches sent as they are (loopback or a LAN; zstd bodies are read all the same)."""


class DynamicConfig(ResponseModel):
    """`POST /api/v1/client/dynamic_config`: abandoned futures are not cancelled (a sample
    runs to its end; its result expires unread)."""

    sample_cancel_enabled: bool = False


class SupportedModel(ResponseModel):
    model_name: str
    max_context_length: int | None = None
    sampleable: bool = True
    trainable: bool = False


class ServerCapabilities(ResponseModel):
    supported_models: list[SupportedModel]


class CreateSessionAnswer(ResponseModel):
    session_id: str
    type: Literal["create_session"] = "create_session"


class CreateSamplingSessionAnswer(ResponseModel):
    sampling_session_id: str
    type: Literal["create_sampling_session"] = "create_sampling_session"


class SamplerInfo(ResponseModel):
    """`GET /api/v1/samplers/{id}`."""

    sampler_id: str
    base_model: str
    model_path: str | None = None


class UntypedFuture(ResponseModel):
    """What `asample` answers: the future's id, and one id per sample to come."""

    request_id: str
    model_id: str | None = None
    sample_sequence_ids: list[str]


class TryAgain(ResponseModel):
    """A future not finished within the long poll: the SDK asks again at once."""

    type: Literal["try_again"] = "try_again"
    request_id: str
    queue_state: Literal["active", "paused_capacity", "paused_rate_limit"] = "active"


class RequestFailed(ResponseModel):
    """A future that failed: `category` "user" for what the request asked (a 4xx's cause),
    "server" for what went wrong here; the SDK raises it as `RequestFailedError`."""

    error: str
    category: Literal["user", "server", "unknown"]


# -- training (the `rl` extra) ----------------------------------------------------------------


class LoraConfig(RequestModel):
    rank: Annotated[int, Field(ge=1, le=256)]
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class AdamParams(RequestModel):
    """Tinker's `AdamParams` (AdamW: torch's, weight decay 0 by default)."""

    learning_rate: Annotated[float, Field(ge=0)] = 0.0001
    beta1: Annotated[float, Field(ge=0, lt=1)] = 0.9
    beta2: Annotated[float, Field(ge=0, lt=1)] = 0.95
    eps: Annotated[float, Field(gt=0)] = 1e-12
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    grad_clip_norm: Annotated[float, Field(ge=0)] = 0.0


class CreateModel(RequestModel):
    """`POST /api/v1/create_model`: a LoRA on a served base model."""

    session_id: str
    model_seq_id: int = 0
    base_model: str
    user_metadata: dict[str, Any] | None = None
    lora_config: LoraConfig | None = None
    optimizer_config: dict[str, Any] | None = None
    type: Literal["create_model"] = "create_model"


class GetInfo(RequestModel):
    model_id: str
    type: Literal["get_info"] = "get_info"


class OptimStep(RequestModel):
    """The SDK sends `adam_params`, or `optimizer_params` for another optimizer (refused)."""

    adam_params: AdamParams | None = None
    optimizer_params: dict[str, Any] | None = None
    model_id: str
    seq_id: int | None = None
    type: Literal["optim_step"] = "optim_step"


class SaveWeights(RequestModel):
    model_id: str
    path: str | None = None
    seq_id: int | None = None
    ttl_seconds: Annotated[int, Field(ge=1)] | None = None
    overwrite: bool = False
    user_metadata: dict[str, str] | None = None
    type: Literal["save_weights"] = "save_weights"


class SaveWeightsForSampler(RequestModel):
    model_id: str
    path: str | None = None
    sampling_session_seq_id: int | None = None
    kind: Literal["snapshot", "inflight"] = "snapshot"
    seq_id: int | None = None
    ttl_seconds: Annotated[int, Field(ge=1)] | None = None
    user_metadata: dict[str, str] | None = None
    type: Literal["save_weights_for_sampler"] = "save_weights_for_sampler"


class LoadWeights(RequestModel):
    """`POST /api/v1/load_weights`: into `model_id`, or (the SDK's
    `create_training_client_from_state`) into a new model of the checkpoint's configuration."""

    model_id: str | None = None
    seq_id: int | None = None
    session_id: str | None = None
    model_seq_id: int | None = None
    base_model: str | None = None
    user_metadata: dict[str, Any] | None = None
    path: str
    optimizer: bool = False
    optimizer_config: dict[str, Any] | None = None
    weights_access_token: str | None = None
    type: Literal["load_weights"] = "load_weights"


class ModelData(ResponseModel):
    arch: str | None = None
    model_name: str | None = None
    tokenizer_id: str | None = None


class InfoAnswer(ResponseModel):
    """`POST /api/v1/get_info`: `tokenizer_id` a directory the SDK's `get_tokenizer` loads
    without a hub (the trainer's Hugging Face directory: a client on the server's disk)."""

    type: Literal["get_info"] = "get_info"
    model_data: ModelData
    model_id: str
    is_lora: bool = True
    lora_rank: int | None = None
    model_name: str | None = None

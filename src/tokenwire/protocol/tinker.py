"""Tinker's API, as the official `tinker` SDK (0.38) speaks it: its JSON bodies, read from the
SDK's own `types/` (the finished sample is protobuf: `tinker.proto.tinker_public_pb2`,
serving/tinker/wire.py). Only the sampling half; docs/api/tinker.md says what is served."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, StrictInt, Tag

from ._base import RequestModel, ResponseModel
from .common import TokenId

__all__ = [
    "ClientConfig",
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

"""The control plane's wire contract: vLLM 0.32's RL and dev endpoints, by name.

Each is served at vLLM's own path (`vllm/entrypoints/rl/online/api_router.py`,
`vllm/entrypoints/serve/dev/`) with vLLM's bodies, so a trainer written against vLLM points at
tokenwire unchanged; tokenwire adds `replicas` (each replica's status and body) to the answer.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from ._base import RequestModel

__all__ = ["CONTROL_BODIES", "CONTROL_OPS", "ROLLING_STEPS", "ROLLING_UPDATE",
           "CollectiveRpcBody", "ControlBody", "FinishWeightUpdateBody",
           "InitWeightTransferBody", "Label", "LoadLoraAdapterBody", "RollingStep",
           "RollingUpdateBody", "UnloadLoraAdapterBody",
           "UpdateWeightVersionBody", "UpdateWeightsBody"]

CONTROL_OPS: dict[str, tuple[str, str]] = {
    "pause": ("POST", "/pause"),
    "resume": ("POST", "/resume"),
    "is_paused": ("GET", "/is_paused"),
    "update_weight_version": ("POST", "/update_weight_version"),
    "weight_info": ("GET", "/weight_info"),
    "reset_prefix_cache": ("POST", "/reset_prefix_cache"),
    "sleep": ("POST", "/sleep"),
    "wake_up": ("POST", "/wake_up"),
    "is_sleeping": ("GET", "/is_sleeping"),
    "init_weight_transfer_engine": ("POST", "/init_weight_transfer_engine"),
    "start_weight_update": ("POST", "/start_weight_update"),
    "update_weights": ("POST", "/update_weights"),
    "finish_weight_update": ("POST", "/finish_weight_update"),
    "collective_rpc": ("POST", "/collective_rpc"),
    "load_lora_adapter": ("POST", "/v1/load_lora_adapter"),
    "unload_lora_adapter": ("POST", "/v1/unload_lora_adapter"),
}
"""(method, path) of each control call."""


Label = Annotated[str, StringConstraints(min_length=1, max_length=256)]
"""A weight version label: free text, bounded (every sampled token carries it)."""
_Name = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class ControlBody(RequestModel):
    """The body of a call that takes none (vLLM's take their options in the query): empty, or
    `{}`."""


class UpdateWeightVersionBody(ControlBody):
    new_version: Label
    """The label every token sampled from now on carries (`weight_versions`)."""


class FinishWeightUpdateBody(ControlBody):
    weight_version: Label | None = None
    """Relabel the weights as this version (else the label stays)."""


class InitWeightTransferBody(ControlBody):
    init_info: dict[str, Any]
    """The weight transfer backend's own settings (passed to a vLLM replica as sent)."""


class UpdateWeightsBody(ControlBody):
    update_info: dict[str, Any] | list[dict[str, Any]] = Field(default_factory=dict)
    """vLLM's `WeightTransferUpdatePayload`; the embedded engine reads `weights_path` (a GGUF),
    or `lora_path` and `lora_scale`, or `lora` (a list of `{path, scale}`), and an optional
    `weight_version`."""


class CollectiveRpcBody(ControlBody):
    method: _Name
    args: list[str] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    timeout: float | None = None


class LoadLoraAdapterBody(ControlBody):
    """vLLM's `LoadLoRAAdapterRequest` (`entrypoints/serve/lora/protocol.py`)."""

    lora_name: _Name
    """The name requests use as their `model`."""
    lora_path: Label
    """Where each replica reads the adapter (a PEFT directory); also the adapter's version,
    which every sample it makes names: a replacement comes from a new path."""
    load_inplace: bool = False
    """Replace an adapter of that name (vLLM's flag); tokenwire drains each replica first."""
    is_3d_lora_weight: bool = False


class UnloadLoraAdapterBody(ControlBody):
    lora_name: _Name
    lora_int_id: int | None = None


CONTROL_BODIES: dict[str, type[ControlBody]] = {
    "update_weight_version": UpdateWeightVersionBody,
    "finish_weight_update": FinishWeightUpdateBody,
    "init_weight_transfer_engine": InitWeightTransferBody,
    "update_weights": UpdateWeightsBody,
    "collective_rpc": CollectiveRpcBody,
    "load_lora_adapter": LoadLoraAdapterBody,
    "unload_lora_adapter": UnloadLoraAdapterBody,
}
"""The typed body of each control call that takes one (the others: `ControlBody`)."""


ROLLING_UPDATE = ("POST", "/rolling_update")
"""tokenwire's own call: new weights for the fleet a few replicas at a time (rolling.py)."""

ROLLING_STEPS = ("init_weight_transfer_engine", "start_weight_update", "update_weights",
                 "finish_weight_update", "collective_rpc", "reset_prefix_cache")
"""The calls that may update one replica in a rolling update (the update pauses, labels and
resumes each replica itself)."""


class RollingStep(ControlBody):
    """One of the calls that update a replica, as the plain control call takes it."""

    op: Literal[ROLLING_STEPS]  # type: ignore[valid-type]
    body: dict[str, Any] | None = None
    """The call's body (checked as the plain call checks it)."""
    query: dict[str, str] = Field(default_factory=dict)


class RollingUpdateBody(ControlBody):
    weight_version: Label
    """The label the fleet's weights carry when the update is done; replicas that already
    report it are left as they are (so the same call again resumes a roll that stopped)."""
    calls: list[RollingStep] = Field(default_factory=list)
    """What makes one replica take the new weights, in order (e.g. `collective_rpc` with
    `reload_weights`); none: only relabel."""
    max_unavailable: Annotated[int, Field(ge=1)] = 1
    """Replicas updated at once (Kubernetes' name); the others keep serving."""
    pause_mode: Literal["wait", "abort"] = "wait"
    """vLLM's pause mode for each replica: `wait` lets its requests finish (none fails), `abort`
    ends them now (`finish_reason: "abort"`). (`keep` would carry prefixes cached under the old
    weights past the update: use the plain calls and `reset_prefix_cache` for that.)"""

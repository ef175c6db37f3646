"""The control plane's wire contract: vLLM 0.32's RL and dev endpoints, by name.

Each is served at vLLM's own path (`vllm/entrypoints/rl/online/api_router.py`,
`vllm/entrypoints/serve/dev/`) with vLLM's bodies, so a trainer written against vLLM points at
tokenwire unchanged; tokenwire adds `replicas` (each replica's status and body) to the answer.
"""

from __future__ import annotations

__all__ = ["CONTROL_OPS"]

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
}
"""(method, path) of each control call."""

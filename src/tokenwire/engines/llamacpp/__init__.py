"""The embedded engine: llama.cpp through llama-cpp-python's low-level API.

One worker thread owns the model. Each loop turn it admits waiting requests into free sequence
slots, packs one `llama_batch` with the next token of every decoding sequence plus a chunk of
pending prompt tokens, runs a single `llama_decode` for all of them, and samples each sequence
with its own C-side sampler chain. Events cross to the asyncio side through
`loop.call_soon_threadsafe`, so model compute never blocks the event loop. A consumer that stops
iterating marks its sequence cancelled; the worker frees the slot before the next decode.

The control plane (vLLM's RL endpoints, rl_endpoints.py) runs on the worker thread too, between
two decodes: pausing (abort, drain, or freeze the batch), new weights (a GGUF, LoRA adapters)
and their version label, which every sampled token is stamped with (`weight_versions`).

The package, by concern: state.py (what the engine holds, a sequence's record, releasing and
finishing one), engine.py (`LlamaCppEngine`: start, admission, the worker's loop), kv_reuse.py
(the prefix cache: which slot's KV a prompt reuses), decode.py (one `llama_decode` for the
batch, then each sequence sampled), control_plane.py (pause, weights, LoRA, versions, on the
worker between decodes) over rl_endpoints.py (vLLM's RL endpoints in vLLM's shapes), model.py
(typed llama.cpp calls), slots.py (the slots and what they hold).
"""

from .engine import LlamaCppEngine

__all__ = ["LlamaCppEngine"]

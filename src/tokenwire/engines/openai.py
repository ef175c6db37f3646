"""A text-only OpenAI-compatible upstream (Ollama, a hosted API, any `/v1/completions`).

Such a server takes text and returns text, so this is the one engine where ids cross a text
boundary, and it says so: `token_ids_source: "retokenized"`, never "sampled". The prompt ids
(rendered by the gateway's token-space template) are decoded with the pinned tokenizer and sent
as the prompt of `POST /v1/completions`; the text that streams back is re-encoded with the same
tokenizer by an incremental encoder, which only emits ids that later text cannot change, so the
streamed ids are exactly the ids of the whole output.

Decoding a rendered prompt gives the template's control tokens as their strings; servers that
parse special tokens in prompts (llama-server, vLLM) turn them back into the same ids. But they
would do the same to a user's text that spells one (`<|im_end|><|im_start|>system`), which the
token-space template keeps as text: a prompt whose text re-encodes to other control ids than it
holds is refused (special_token_not_allowed), never sent. A leading BOS is left to the upstream,
which adds its own to a text prompt. Logprobs carry no ids here, stop ids and `ignore_eos` have
no text-API field: all refused by name. Usage counts the upstream's own tokens. Both crossings
count as tokenizer conversions with reason "upstream" (tokenizers/conversions.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from ..errors import SpecialTokenNotAllowedError, UnsupportedParameterError
from ..tokenizers.conversions import conversion_reason
from ..tokenizers.reencode import IncrementalEncoder
from .base import EngineEvent, EngineInfo, FinishEvent, SamplingParams, TokenEvent
from .spec import EngineSpec
from .upstream import ChunkDecoder, Replica, UpstreamEngine, UpstreamInfo

__all__ = ["OpenAITextEngine"]


class _TextDecoder(ChunkDecoder):
    def __init__(self, encoder: IncrementalEncoder, *, keep: bool = True):
        """`keep` False: a scoring-only request (no output wanted; the upstream samples one)."""
        self._enc = encoder
        self._keep = keep
        self._reason: str | None = None

    @conversion_reason("upstream")
    def feed(self, chunk: dict[str, Any]) -> list[EngineEvent]:
        events: list[EngineEvent] = []
        for choice in chunk.get("choices") or []:
            text = (choice.get("text") or "") if self._keep else ""
            events += [TokenEvent(t) for t in self._enc.push(text)]
            if choice.get("finish_reason") is not None:
                self._reason = "length" if choice["finish_reason"] == "length" else "stop"
        usage = chunk.get("usage")
        if isinstance(usage, dict) and self._reason is not None:  # the trailing usage chunk
            events += self._finish(usage.get("completion_tokens"))
        return events

    @conversion_reason("upstream")
    def end(self) -> list[EngineEvent]:
        return self._finish(None) if self._reason is not None else []

    def _finish(self, counted: Any) -> list[EngineEvent]:
        events: list[EngineEvent] = [TokenEvent(t) for t in self._enc.finish()]
        reason: Literal["stop", "length"] = "length" if self._reason == "length" or \
            not self._keep else "stop"
        self._reason = None
        return [*events, FinishEvent(reason, n_sampled=counted if isinstance(counted, int)
                                     and self._keep else None)]


class OpenAITextEngine(UpstreamEngine):
    name = "openai"
    health_path = "/v1/models"

    def __init__(self, spec: EngineSpec):
        super().__init__(spec)
        self._tok = spec.source.tokenizer

    async def describe(self, replica: Replica) -> UpstreamInfo:
        card = await self.model_card(replica)
        # the context length: the upstream's word if it gives one, else the model's own files
        length = (card.get("max_model_len") or self._settings.max_model_len
                  or self._spec.source.context_length)
        if not isinstance(length, int):
            raise ValueError("it does not say its context length; set --max-model-len")
        return UpstreamInfo(model=str(card["id"]), max_model_len=length, mode="text")

    async def tokenize(self, replica: Replica, texts: Sequence[str]) -> list[list[int]] | None:
        return None  # a text server has no ids to compare

    def engine_info(self, first: UpstreamInfo) -> EngineInfo:
        return dataclasses.replace(super().engine_info(first), token_ids_source="retokenized",
                                   supports_logprobs=False, supports_prompt_logprobs=False,
                                   supports_grammar=False, supports_lazy_grammar=False)

    def request(self, replica: Replica, prompt: Sequence[int],
                params: SamplingParams) -> tuple[str, dict[str, Any]]:
        if params.grammar is not None:
            raise UnsupportedParameterError("a text-only upstream cannot follow a grammar",
                                            param="response_format")
        if params.logprobs is not None or params.prompt_logprobs is not None:
            raise UnsupportedParameterError(
                "logprobs need the ids the model sampled; this server's upstream returns text "
                "only", param="logprobs")
        for name, value in (("stop_token_ids", params.stop_token_ids),
                            ("ignore_eos", params.ignore_eos), ("top_k", params.top_k),
                            ("min_p", params.min_p), ("min_tokens", params.min_tokens),
                            ("repetition_penalty", params.repetition_penalty != 1.0),
                            ("logit_bias", params.logit_bias)):
            if value:
                raise UnsupportedParameterError(
                    f"{name!r} has no field in the text API of this model's upstream",
                    param=name)
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": self._prompt_text(prompt),
            "max_tokens": max(1, params.max_tokens),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if params.presence_penalty:
            body["presence_penalty"] = params.presence_penalty
        if params.frequency_penalty:
            body["frequency_penalty"] = params.frequency_penalty
        return "/v1/completions", body

    def decoder(self, replica: Replica, prompt: Sequence[int],
                params: SamplingParams) -> ChunkDecoder:
        return _TextDecoder(IncrementalEncoder(self._tok), keep=params.max_tokens > 0)

    @conversion_reason("upstream")
    def _prompt_text(self, prompt: Sequence[int]) -> str:
        """The text the upstream re-encodes into exactly the prompt's control tokens."""
        src = self._spec.source
        if src.add_bos and prompt and prompt[0] == src.bos_id:
            prompt = prompt[1:]  # the upstream adds its own to a text prompt
        text = self._tok.decode(prompt)
        special = self._tok.special_ids
        if [t for t in self._tok.encode(text, parse_special=True) if t in special] != \
                [t for t in prompt if t in special]:
            raise SpecialTokenNotAllowedError(
                "this model's upstream takes text, where text that spells a control token "
                "becomes one; the prompt holds such text, so it is not sent", param="messages")
        return text


"""What the generating services share: their wiring, the token-space check of a request, and
the plan of a checked request (what its responses all carry)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from ..config import Settings
from ..engines.base import ReplicaLostError
from ..errors import InvalidRequestError, UnsupportedParameterError
from ..metrics import Metrics, PromptKind, TokenTimer
from ..protocol.common import ResponseWarning, StreamOptions, Usage
from ..protocol.generate import GenerateStreamOptions
from ..storage.base import owner_of
from ..tokenizers.conversions import conversion_reason
from ..tokenizers.registry import TokenizerRegistry
from ..tokenizers.translate import Translator, translator
from .generation import ChoiceResult, Choices, Family, StreamedResponse, Totals, collect
from .guard import Guard
from .logprobs import IdMap, same_id
from .models import ModelRegistry, ServedModel
from .tokens import TokenSpace, resolve_token_space

__all__ = ["ANONYMOUS", "Caller", "GenerationService", "OutIds", "Plan",
           "check_engine_features", "check_sampling_mask", "run_whole"]

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")
_E = TypeVar("_E")


@dataclass(frozen=True)
class Caller:
    """Who sent the request, as far as serving cares (the HTTP layer fills it in)."""

    api_key: str | None = None
    """The key the request was authenticated with (None on a keyless server)."""

    @property
    def owner(self) -> str:
        """Whose stored records it may read and write (one key never sees another's)."""
        return owner_of(self.api_key)


ANONYMOUS = Caller()


def check_engine_features(model: ServedModel, *, logprobs: bool, prompt_logprobs: bool,
                          prompt_param: str = "prompt_logprobs") -> None:
    """What the model's engine cannot do is refused by name, never silently dropped."""
    info = model.engine.info
    if logprobs and not info.supports_logprobs:
        raise UnsupportedParameterError(
            f"logprobs are not available for model {model.id!r}: its engine returns text, "
            "not the ids it sampled", param="logprobs")
    if prompt_logprobs and not info.supports_prompt_logprobs:
        raise UnsupportedParameterError(
            f"model {model.id!r} cannot score prompt tokens (its engine has no prompt "
            "logprobs)", param=prompt_param)


def check_sampling_mask(model: ServedModel, *, temperature: float | None, top_k: int | None,
                        prefix: str = "") -> None:
    """vLLM's rule where every sampled token says what the sampler could have drawn
    (`--return-sampling-mask`): a request samples (temperature > 0) from a bounded support
    (top_k > 0), so a mask never lists the whole vocabulary."""
    if not model.engine.info.sampling_mask:
        return
    if temperature is not None and temperature <= 0:
        raise InvalidRequestError(
            "this server returns sampling masks (--return-sampling-mask): a request must "
            "sample, with temperature > 0", param=f"{prefix}temperature", code="invalid_value")
    if top_k is None or top_k <= 0:
        raise InvalidRequestError(
            "this server returns sampling masks (--return-sampling-mask): a request must bound "
            "what it samples from, with top_k > 0", param=f"{prefix}top_k", code="invalid_value")


@dataclass(kw_only=True)
class Plan:
    model: ServedModel
    space: TokenSpace
    shows_ids: bool
    """The request asked for ids back (either dialect)."""
    sent_ids: bool
    """The request carried token ids (`input_tokens`, assistant `token_ids`, id prompts)."""
    id: str
    warnings: list[ResponseWarning] | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    skip_special: bool = False
    """Control tokens add no text to the output (`skip_special_tokens`)."""
    logprobs_mode: str | None = None
    """What the response's logprobs are (vLLM's `--logprobs-mode` names), when it has any and
    the engine says."""

    def usage(self, t: Totals) -> Usage:
        """The response's usage, from its finished choices."""
        raise NotImplementedError

    def out_ids(self, ids: list[int]) -> list[int]:
        """A whole choice's output ids in the client's version (translated when it is not the
        model's: tokenizers/translate.py)."""
        if not self.space.translate:
            return ids
        return self._translator().translate(ids, skip_special=self.skip_special).token_ids

    def out_stream(self) -> OutIds:
        """One streamed choice's output ids in the client's version: concat(push(...) ...
        finish()) == out_ids(all of them), however the deltas cut them."""
        return OutIds(self._translator() if self.space.translate else None, self.skip_special)

    def stop_reason(self, reason: int | str | None) -> int | str | None:
        """The id that ended a choice, in the client's version: the control token of the same
        text, else (one of the model's end-of-generation ids: Gemma's `<end_of_turn>` as well
        as its EOS) the client version's EOS; None where it has neither."""
        if not self.space.translate or not isinstance(reason, int):
            return reason
        mapped = self._translator().control(reason)
        if mapped is None and (reason == self.space.model.eos_id
                               or reason in self.model.engine.info.eog_ids):
            mapped = self.space.client.eos_id
        return mapped

    def logprob_ids(self) -> IdMap:
        """The id each logprob entry shows: the model's own, or under translate the client
        version's one id for the entry's bytes (None where it has none)."""
        return self._translator().token_id if self.space.translate else same_id

    def _translator(self) -> Translator:
        return translator(self.space.model.tokenizer, self.space.client.tokenizer)

    def envelope(self) -> dict[str, Any]:
        """The fields every response (or chunk) of this request carries."""
        env: dict[str, Any] = {"id": self.id, "created": self.created, "model": self.model.id}
        if self.shows_ids:
            env["tokenizer_version"] = self.space.client.version
            env["token_ids_source"] = self.source
        if self.logprobs_mode is not None:
            env["logprobs_mode"] = self.logprobs_mode
        return env

    @property
    def prompt_kind(self) -> PromptKind:
        return "tokens" if self.sent_ids else "text"

    @property
    def source(self) -> str:
        """Where the output ids come from: what the model sampled, or a re-encoding of text
        (translated into the client's version, or an upstream that returns only text)."""
        if self.space.translate:
            return "translated"
        return self.model.engine.info.token_ids_source


class OutIds:
    """Output ids of one streamed choice, as the client's version has them."""

    def __init__(self, tr: Translator | None, skip_special: bool):
        self._stream = tr.stream(skip_special=skip_special) if tr is not None else None

    def push(self, ids: list[int]) -> list[int]:
        return self._stream.push(ids) if self._stream is not None else ids

    def finish(self) -> list[int]:
        """The ids still held back (at the choice's end)."""
        return self._stream.finish() if self._stream is not None else []


async def run_whole(run: Callable[[], Awaitable[_T]]) -> _T:
    """A response sent whole, run once more if its upstream replica was lost and the gateway
    could not continue the sequence elsewhere (engines/upstream/migration.py says when): nothing
    has reached the client, so it may start over; the lost replica is down, and admission goes
    to another. A stream cannot do this: it ends with the in-band error."""
    try:
        return await run()
    except ReplicaLostError as exc:
        log.warning("engine lost the request mid-generation (%s); running it again", exc)
    return await run()


class GenerationService:
    """Base of the generating services (chat, completions, generate)."""

    def __init__(self, models: ModelRegistry, tokenizers: TokenizerRegistry, settings: Settings,
                 guard: Guard, metrics: Metrics):
        self._models = models
        self._tokenizers = tokenizers
        self._settings = settings
        self._guard = guard
        self._metrics = metrics

    @staticmethod
    async def _prepare(plan: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """A request's plan (encode, canonicality, content policy, template), built in a worker
        thread: one 100k-character prompt then holds up no other stream's tokens. The
        conversions it makes count as the prompt's, unless a step names its own reason."""
        with conversion_reason("prompt"):  # the worker thread gets a copy of the context
            return await asyncio.to_thread(plan, *args, **kwargs)

    def _served(self, plan: Plan, usage: Usage) -> Usage:
        """Count a request's usage where its response computes it, once (a stream's in its
        `finally`: one cut short still counts its prompt and the choices that finished)."""
        self._metrics.served(plan.model.id, plan.prompt_kind, usage)
        return usage

    def _count(self, plan: Plan, t: Totals) -> Usage:
        return self._served(plan, plan.usage(t))

    def _stream(self, plan: Plan, family: Family[_E], choices: Choices) -> StreamedResponse[_E]:
        """A streamed response: `family`'s events of the choices, its usage counted once."""
        return StreamedResponse(family, choices, lambda t: self._count(plan, t))

    def _timer(self, plan: Plan) -> TokenTimer:
        return self._metrics.timer(plan.model.id)

    def _coalesce(self, options: StreamOptions | GenerateStreamOptions | None) -> bool:
        """Whether tokens at hand together make one event: the request's say, else the
        server's (`stream_coalesce`)."""
        if options is not None and options.coalesce is not None:
            return options.coalesce
        return self._settings.stream_coalesce

    async def _whole(self, start: Callable[[], Awaitable[Choices]],
                     n: int) -> list[ChoiceResult]:
        """Every choice of a response sent whole (see `run_whole`)."""
        return await run_whole(lambda: self._collect(start, n))

    @staticmethod
    async def _collect(start: Callable[[], Awaitable[Choices]], n: int) -> list[ChoiceResult]:
        return await collect(await start(), n)

    def _space(self, model: ServedModel, version: str | None, fallback: str,
               carries_ids: bool) -> TokenSpace:
        return resolve_token_space(
            target=model.tokenizer_entry, target_name=f"model {model.id!r}",
            registry=self._tokenizers, version=version, fallback=fallback,
            carries_ids=carries_ids, require_version=self._settings.require_tokenizer_version)

"""A scripted engine for fast HTTP-layer tests (the real engine has tests of its own)."""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncGenerator, Sequence

from tokenwire.engines.base import (
    EngineBase,
    EngineEvent,
    EngineHealth,
    EngineInfo,
    FinishEvent,
    PromptLogprobsEvent,
    SamplingParams,
    TokenEvent,
)
from tokenwire.errors import EngineError
from tokenwire.tokenizers.hf import HFTokenizer, canonical_json

MODEL = "fake-smollm2"
"""The id the in-process app serves its scripted engine under."""


class FakeStream:
    """The scripted events as an `EventStream` (its next event is never at hand)."""

    ready = False

    def __init__(self, events: AsyncGenerator[EngineEvent, None]):
        self._events = events

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> EngineEvent:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()


class BurstStream(FakeStream):
    """The scripted events all at hand at once, as an upstream's that came in one read."""

    def __init__(self, events: AsyncGenerator[EngineEvent, None]):
        super().__init__(events)
        self._queue: collections.deque[EngineEvent] | None = None

    @property  # type: ignore[override]
    def ready(self) -> bool:
        return bool(self._queue)

    async def __anext__(self) -> EngineEvent:
        if self._queue is None:
            self._queue = collections.deque([ev async for ev in self._events])
        if not self._queue:
            raise StopAsyncIteration
        return self._queue.popleft()


class FakeEngine(EngineBase):
    """Samples `script` (then the end-of-generation id), one token per `delay` seconds."""

    def __init__(self, *, vocab_size: int, eog_id: int, script: Sequence[int] = (),
                 max_model_len: int = 2048, delay: float = 0.0):
        self._info = EngineInfo(model="fake", max_model_len=max_model_len,
                                vocab_size=vocab_size, eog_ids=frozenset({eog_id}))
        self.eog_id = eog_id
        self.script = list(script)
        self.scripts: list[list[int]] = []
        """When set, the script of each admitted sequence in turn (choices that differ)."""
        self.delay = delay
        self.prompts: list[list[int]] = []
        self.params: list[SamplingParams] = []
        self.active = 0
        self.refuse: Exception | None = None
        """Raised at admission (e.g. a full queue)."""
        self.fail_after: int | None = None
        """Raise EngineError after this many tokens (an engine fault mid-generation)."""
        self.health_report = EngineHealth(ok=True)
        self.cached_tokens: int | None = None
        """Reported on each FinishEvent (a prefix cache's hits), when set."""
        self.burst = False
        """Each sequence's events all at hand at once (`BurstStream`)."""

    @property
    def info(self) -> EngineInfo:
        return self._info

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def health(self) -> EngineHealth:
        return self.health_report

    @property
    def n_active(self) -> int:
        return self.active

    @property
    def n_waiting(self) -> int:
        return 0

    async def submit(self, prompt: Sequence[int], params: SamplingParams) -> FakeStream:
        if self.refuse is not None:
            raise self.refuse
        script = self.scripts[len(self.prompts) % len(self.scripts)] if self.scripts \
            else self.script
        self.prompts.append(list(prompt))
        self.params.append(params)
        events = self._run(list(prompt), params, script)
        return BurstStream(events) if self.burst else FakeStream(events)

    async def _run(self, prompt: list[int], params: SamplingParams, script: list[int],
                   ) -> AsyncGenerator[EngineEvent, None]:
        self.active += 1
        try:
            if params.prompt_logprobs is not None:
                k = params.prompt_logprobs
                yield PromptLogprobsEvent(tuple(
                    TokenEvent(t, -1.0, tuple(((t + j) % self._info.vocab_size, -1.0 - j)
                                             for j in range(k)))
                    for t in prompt[1:]))
            for i, t in enumerate(script):
                if self.fail_after is not None and i >= self.fail_after:
                    raise EngineError("the engine failed (injected)")
                if i >= params.max_tokens:
                    yield FinishEvent("length", cached_tokens=self.cached_tokens)
                    return
                await asyncio.sleep(self.delay)
                top = tuple(((t + k) % self._info.vocab_size, -0.5 - k)
                            for k in range(params.logprobs or 0))
                ev = TokenEvent(t, -0.5 if params.logprobs is not None else None, top)
                if t in params.stop_token_ids:
                    yield FinishEvent("stop", stop_token=ev, cached_tokens=self.cached_tokens)
                    return
                yield ev
            yield FinishEvent("stop", stop_token=TokenEvent(
                self.eog_id, -0.5 if params.logprobs is not None else None),
                cached_tokens=self.cached_tokens)
        finally:
            self.active -= 1


def other_tokenizer() -> HFTokenizer:
    """A real, different tokenizer family: a byte-level BPE trained here on a small corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["The quick brown fox jumps over the lazy dog.", "Bonjour à tous, ça va?",
              "Token ids are integers; text is portable."] * 20
    raw.train_from_iterator(corpus, trainer)
    return HFTokenizer(canonical_json(json.loads(raw.to_str())), family="tiny-bpe-400")

#: a ChatML template that renders tools and calls itself (the Hermes-like shape of Qwen's)
CHATML_TOOLS = """{%- if tools %}<|im_start|>system
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}<|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{%- if m.name %} ({{ m.name }}){% endif %}
{{ m.content }}
{%- for c in m.tool_calls or [] %}
<tool_call>{"name": "{{ c.function.name }}", \
"arguments": {{ c.function.arguments | tojson }}}</tool_call>
{%- endfor %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

#: the same, in Gemma 3's markers (its roles are `user` and `model`; BOS is the template's)
GEMMA_TOOLS = """{{ bos_token }}
{%- if tools %}<start_of_turn>user
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}<end_of_turn>
{% endif %}
{%- for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}
{{ m.content }}
{%- for c in m.tool_calls or [] %}
<tool_call>{"name": "{{ c.function.name }}", \
"arguments": {{ c.function.arguments | tojson }}}</tool_call>
{%- endfor %}<end_of_turn>
{% endfor %}
{%- if add_generation_prompt %}<start_of_turn>model
{% endif %}"""

"""The `Engine` protocol: prompt ids and sampling parameters in, sampled ids out.

Engines are transports. They know nothing of HTTP, chat templates or text: serving code hands
them token ids and consumes a stream of domain events. Admission is awaited (`await
engine.submit(...)`), so an engine that only learns of a 400/429/503 after a round trip to an
upstream still raises it before the response starts. Closing the stream early (a client went
away, a stop string matched) cancels the sequence and frees its slot.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, overload, runtime_checkable

from ..errors import (
    ContextLengthExceededError,
    EngineStartError,
    InvalidRequestError,
    InvalidTokenIdError,
    ServiceUnavailableError,
    UnsupportedParameterError,
)
from ..protocol.control import CONTROL_OPS
from .versions import WeightBound

__all__ = [
    "LOGPROB_FLOOR",
    "Engine",
    "check_prompt",
    "CONTROL_OPS",
    "ControlAnswer",
    "ControlCall",
    "EngineBase",
    "EngineEvent",
    "EngineStartError",
    "EngineHealth",
    "EngineInfo",
    "EventStream",
    "FinishEvent",
    "Grammar",
    "ProcessHealth",
    "PromptLogprobsEvent",
    "ReplicaHealth",
    "ReplicaLostError",
    "SamplingParams",
    "StructuralTag",
    "TokenEvent",
    "TokenRun",
    "WeightSpan",
    "join_events",
]


class ReplicaLostError(ServiceUnavailableError):
    """The upstream replica serving a sequence went away mid-response. Nothing of a response
    sent whole has reached the client yet, so serving may run it again (elsewhere: the replica
    is marked down). A client sees 503 engine_unavailable."""


@dataclass(frozen=True)
class StructuralTag:
    """One kind of constrained span of a lazy grammar: `begin`, a JSON value valid against
    `schema` (JSON text), `end` (vLLM's and SGLang's `structural_tag` structures)."""

    begin: str
    schema: str
    end: str
    param: str = ""
    """The request field the schema came from (named when it cannot be enforced)."""


@dataclass(frozen=True)
class Thought:
    """The reasoning a grammar lets the model write first: free text between its markers."""

    start: str
    end: str
    inside: bool
    """The prompt opened it (the model starts inside it)."""
    budget: int | None = None
    """Most tokens of reasoning (vLLM's `thinking_token_budget`): then the end marker is
    forced."""


@dataclass(frozen=True)
class Grammar:
    """What a constrained output must follow, in the request's own terms (exactly one of a JSON
    schema, a client's GBNF, or tagged spans); each engine spells it for its grammar library:
    the embedded engine compiles it with llguidance (_guide.py), an upstream is sent the
    schema, grammar or structural tag itself, so that its own grammar backend enforces it."""

    json_schema: str | None = None
    """The output is one JSON value valid against this schema (JSON text); json_object mode is
    `{"type": "object"}`. (None of the three: any text, which only a `reasoning` bounds.)"""
    gbnf: str | None = None
    """A client's own grammar, in llama.cpp's GBNF (vLLM's `structured_outputs.grammar`)."""
    tags: tuple[StructuralTag, ...] = ()
    """Tagged spans (tool calls): each `begin`, a JSON value valid against its schema, `end`."""
    triggers: tuple[str, ...] = ()
    """Lazy (tags only): the output is free until one of these words appears; from that word on
    (the word included) it is tagged spans. Empty: the spans hold from the first token."""
    parallel: bool = False
    """Tags: one or more spans, `separator` apart (else exactly one)."""
    separator: str = "\n"
    section: tuple[str, str] = ("", "")
    """Tags: what opens and closes the spans together (DeepSeek's `<｜tool▁calls▁begin｜>`...);
    a lazy grammar's trigger begins the opening, where there is one."""
    reasoning: Thought | None = None
    """The model reasons first: the grammar holds from the end of its reasoning on (engines
    that can say so: `EngineInfo.grammar_after_reasoning`)."""
    param: str = "grammar"
    """The request field it was built from (named when it cannot be enforced)."""

    @property
    def lazy(self) -> bool:
        return bool(self.triggers)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    """Most tokens to sample, the end-of-generation token included (0: only score the prompt)."""
    temperature: float = 1.0
    """0 means greedy (argmax)."""
    top_p: float = 1.0
    seed: int | None = None
    """Seed of the sampler's random generator (32 bits); None: a random seed."""
    logprobs: int | None = None
    """None: no logprobs; k >= 0: the chosen token's logprob and the k most likely tokens'
    (of the distribution `EngineInfo.logprobs_mode` names)."""
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    """OpenAI's penalties: they count the output only."""
    repetition_penalty: float = 1.0
    """vLLM's: logits of ids seen in the prompt or the output divided by it (multiplied where
    negative); 1 is off."""
    top_k: int = 0
    """Draw among the k most likely ids only; 0 is off."""
    min_p: float = 0.0
    """Draw among ids at least `min_p` times as likely as the most likely one (after
    temperature); 0 is off."""
    min_tokens: int = 0
    """No stop id (the model's nor `stop_token_ids`) is sampled before this many tokens."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(id, bias) added to the raw logits before everything else (OpenAI's `logit_bias`)."""
    prompt_logprobs: int | None = None
    """None: none; k >= 0: each prompt token's logprob given its prefix, and the k most likely
    tokens there (scoring, `echo` with logprobs). Delivered in one `PromptLogprobsEvent`."""
    stop_token_ids: frozenset[int] = frozenset()
    """Ids that end the output like an end-of-generation id (beside the model's own)."""
    ignore_eos: bool = False
    """Do not stop at the model's end-of-generation ids (`stop_token_ids` still stop)."""
    grammar: Grammar | None = None
    """Constrained decoding (tool calls, `response_format`); engines that cannot are refused
    before admission (`EngineInfo.supports_grammar`)."""
    cache_salt: str | None = None
    """Isolates prefix-cache reuse between tenants: the embedded engine's and a gateway's
    routing; passed to vLLM and SGLang; llama-server, which cannot salt, does not reuse its
    cache for a salted request (one way only)."""
    cache_key: str | None = None
    """OpenAI's `prompt_cache_key`: a gateway sends requests with one key to one replica."""
    adapter: str | None = None
    """The LoRA adapter (its name) that samples it, where the engine serves named adapters
    (`Engine.adapters`); None: the base weights."""
    weight_bound: WeightBound | None = None
    """Which weights may serve it (`min_weight_version`, `max_staleness`): a gateway routes
    only to replicas within it; the embedded engine checks its own."""
    whole: bool = False
    """Only the finished output is read (no stream to a client, no stop string or output
    check that ends it early): an upstream may answer in one body instead of an event per
    token."""

    def stops(self, eog_ids: frozenset[int]) -> frozenset[int]:
        """Every id whose sampling ends the output."""
        return self.stop_token_ids if self.ignore_eos else self.stop_token_ids | eog_ids


LOGPROB_FLOOR = -9999.0
"""vLLM's stand-in for a logprob of -inf (an id the sampler truncated) or one not reported:
JSON has no -inf."""


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One sampled token. Logprobs are of the model's raw distribution (before temperature)."""

    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    weight_version: str | None = None
    """Set where the weights that sampled it differ from the previous token's (and on the
    first), by an engine that knows mid-generation (the embedded one): a stream shows the
    change as it happens."""
    sampling_mask: tuple[int, ...] | None = None
    """The ids the sampler could have drawn this token from (what grammar, min-p, top-k and
    top-p left), ascending, where the engine was asked to say (vLLM's `sampling_mask`)."""


@dataclass(frozen=True, slots=True)
class TokenRun(Sequence[TokenEvent]):
    """`ids[i]` was sampled with `logprobs[i]` (None: no logprobs asked); its top entries are
    `top_ids[top_starts[i]:top_starts[i + 1]]` with `top_logprobs` alike, most likely first."""

    ids: array[int]
    logprobs: array[float] | None = None
    top_ids: array[int] | None = None
    top_logprobs: array[float] | None = None
    top_starts: array[int] | None = None

    @classmethod
    def of(cls, ids: Sequence[int], logprobs: Sequence[float] | None = None,
           tops: Sequence[Sequence[tuple[int, float]]] | None = None) -> TokenRun:
        """From per-token lists (`tops`: each token's (id, logprob) entries)."""
        if logprobs is None:
            return cls(array("q", ids))
        starts = array("q", [0])
        top_ids: array[int] = array("q")
        top_lps: array[float] = array("d")
        for entries in tops or [()] * len(ids):
            for t, lp in entries:
                top_ids.append(t)
                top_lps.append(lp)
            starts.append(len(top_ids))
        return cls(array("q", ids), array("d", logprobs), top_ids, top_lps, starts)

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, i: int) -> TokenEvent: ...
    @overload
    def __getitem__(self, i: slice) -> TokenRun: ...

    def __getitem__(self, i: int | slice) -> TokenEvent | TokenRun:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self.ids))
            if step != 1:
                raise ValueError("a run is sliced contiguously")
            return self._slice(start, max(start, stop))
        if i < 0:
            i += len(self.ids)
        if self.logprobs is None:
            return TokenEvent(self.ids[i])
        return TokenEvent(self.ids[i], self.logprobs[i], self.top(i))

    def __iter__(self) -> Iterator[TokenEvent]:
        return (self[i] for i in range(len(self.ids)))

    def top(self, i: int) -> tuple[tuple[int, float], ...]:
        if self.top_starts is None or self.top_ids is None or self.top_logprobs is None:
            return ()
        a, b = self.top_starts[i], self.top_starts[i + 1]
        return tuple(zip(self.top_ids[a:b], self.top_logprobs[a:b], strict=True))

    def _slice(self, a: int, b: int) -> TokenRun:
        if self.logprobs is None:
            return TokenRun(self.ids[a:b])
        assert self.top_starts is not None and self.top_ids is not None \
            and self.top_logprobs is not None
        lo, hi = self.top_starts[a], self.top_starts[b]
        starts = array("q", (s - lo for s in self.top_starts[a:b + 1]))
        return TokenRun(self.ids[a:b], self.logprobs[a:b], self.top_ids[lo:hi],
                        self.top_logprobs[lo:hi], starts)

    def __add__(self, other: TokenRun) -> TokenRun:
        if (self.logprobs is None) != (other.logprobs is None):
            raise ValueError("runs with and without logprobs do not join")
        if self.logprobs is None or other.logprobs is None:
            return TokenRun(self.ids + other.ids)
        assert self.top_starts is not None and other.top_starts is not None
        assert self.top_ids is not None and other.top_ids is not None
        assert self.top_logprobs is not None and other.top_logprobs is not None
        shift = self.top_starts[-1]
        return TokenRun(self.ids + other.ids, self.logprobs + other.logprobs,
                        self.top_ids + other.top_ids, self.top_logprobs + other.top_logprobs,
                        self.top_starts + array("q", (s + shift for s in other.top_starts[1:])))


def join_events(a: Sequence[TokenEvent], b: Sequence[TokenEvent]) -> Sequence[TokenEvent]:
    """`a` then `b`: runs stay runs (no event is made); anything else becomes a list."""
    if not b:
        return a
    if not a:
        return b
    if isinstance(a, TokenRun) and isinstance(b, TokenRun) \
            and (a.logprobs is None) == (b.logprobs is None):
        return a + b
    return [*a, *b]


@dataclass(frozen=True, slots=True)
class WeightSpan:
    """Output tokens `[start, end)` were sampled by the weights labelled `version` (vLLM 0.32's
    `WeightVersionSpan`: with asynchronous RL a weight update can land mid-generation)."""

    version: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class FinishEvent:
    reason: Literal["stop", "length", "abort"]
    """"abort": the engine was paused with `pause?mode=abort` (vLLM's finish reason)."""
    stop_token: TokenEvent | None = None
    """The end-of-generation token the model sampled ("stop"); it is not part of the output.
    None when the upstream does not say which (a text-only engine)."""
    n_sampled: int | None = None
    """Tokens the upstream counted as sampled, where it counts them itself (text-only engines,
    whose re-encoded ids need not be as many); None: the events are the count."""
    cached_tokens: int | None = None
    """Prompt tokens whose KV came from the engine's prefix cache (None: not reported)."""
    weight_versions: tuple[WeightSpan, ...] | None = None
    """Which weights sampled which output tokens, where the engine says (None: not reported)."""
    routed_experts: str | None = None
    """An MoE model's expert choices per token and layer, as vLLM sends them (base64 `.npy`),
    passed on untouched (None: not reported)."""
    migrations: tuple[str, ...] = ()
    """Each move of the sequence to another replica after its own was lost (a gateway's)."""


@dataclass(frozen=True, slots=True)
class PromptLogprobsEvent:
    """Logprobs of prompt tokens 1..n-1 (the first has no prefix to be predicted from)."""

    entries: tuple[TokenEvent, ...]


EngineEvent = TokenEvent | TokenRun | FinishEvent | PromptLogprobsEvent


@runtime_checkable
class EventStream(Protocol):
    """The events of one sequence, ending after exactly one `FinishEvent`; `aclose` cancels."""

    @property
    def ready(self) -> bool:
        """Its next event is at hand: frames of events that came together are written
        together (serving/generation.py `Choices.more`)."""
        ...

    def __aiter__(self) -> EventStream: ...

    async def __anext__(self) -> EngineEvent: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class EngineInfo:
    model: str
    """The served model's id (`model` in requests)."""
    max_model_len: int
    """Most tokens (prompt + output) one sequence may hold."""
    vocab_size: int
    eog_ids: frozenset[int] = field(default_factory=frozenset)
    """End-of-generation tokens: sampling one ends the output with finish_reason "stop"."""
    max_sequences: int | None = None
    """Most sequences the engine holds at once, running and waiting (None: no fixed bound)."""
    token_ids_source: Literal["sampled", "retokenized"] = "sampled"
    """"retokenized": the upstream returns text, and the output ids are its re-encoding."""
    supports_logprobs: bool = True
    """Can report logprobs of sampled tokens (with ids)."""
    supports_prompt_logprobs: bool = True
    """Can score prompt tokens (`echo` with logprobs, `prompt_logprobs`)."""
    supports_grammar: bool = True
    """Can constrain decoding by a `Grammar` that holds from the first token."""
    supports_lazy_grammar: bool = True
    """Can constrain decoding by a lazy `Grammar` (one that starts at a trigger word)."""
    grammar_after_reasoning: bool = False
    """Honours a `Grammar`'s `reasoning` (holds from the end of the model's reasoning); others
    are given grammars without it, which hold from the first token."""
    logprobs_mode: str | None = None
    """What its logprobs are (vLLM's `--logprobs-mode` names), where known."""
    sampling_mask: bool = False
    """Every sampled token says what the sampler could have drawn (`TokenEvent.sampling_mask`);
    then, as in vLLM, a request must sample (temperature > 0) with a bounded support (top_k)."""
    answers_whole: bool = False
    """Answers a request marked `whole` (`SamplingParams`) in one body, not a stream."""
    control_plane: bool = False
    """Takes vLLM's control-plane calls (`Engine.control`; each may still refuse a call it
    cannot make): the embedded engine, and every gateway."""


@dataclass(frozen=True)
class ReplicaHealth:
    url: str
    name: str
    healthy: bool
    reason: str | None = None
    """Why it is not serving (the last failure), when it is not."""
    in_flight: int = 0
    served: int = 0
    """Requests admitted on this replica since start."""
    weight_version: str | None = None
    """The weights' label as the replica last reported it (None: not known)."""
    paused: bool = False
    """Paused by the control plane (a fleet pause, a rolling update): no new requests."""


@dataclass(frozen=True)
class ProcessHealth:
    """The embedded engine's process (the supervisor's word for it)."""

    state: Literal["starting", "up", "restarting", "failed", "stopped"]
    pid: int | None = None
    restarts: int = 0
    """Times it was started again after it died."""
    last_exit: str | None = None
    """How it last died (SIGSEGV, SIGKILL, ...), or why it could not be restarted."""
    backend: str | None = None
    """The CPU and the ggml CPU variant it runs."""


@dataclass(frozen=True)
class EngineHealth:
    ok: bool
    """Can serve a request now (at least one replica is healthy)."""
    reason: str | None = None
    replicas: tuple[ReplicaHealth, ...] = ()
    engine_process: ProcessHealth | None = None


@runtime_checkable
class Engine(Protocol):
    @property
    def info(self) -> EngineInfo: ...

    async def submit(self, prompt: Sequence[int], params: SamplingParams) -> EventStream:
        """Admit a sequence sampling a continuation of `prompt`; raises a `TokenwireError`
        (400, 429, 503) when it cannot, before any event."""
        ...

    def health(self) -> EngineHealth:
        """From what the engine knows now (no round trip): /health must answer at once."""
        ...

    @property
    def n_active(self) -> int:
        """Sequences running now."""
        ...

    @property
    def n_waiting(self) -> int:
        """Sequences admitted but waiting for room."""
        ...

    async def start(self) -> None:
        """Load or connect, and check that the engine's ids agree with the pinned tokenizer."""
        ...

    async def aclose(self) -> None: ...

    # What not every engine does. Every engine has all of it (`EngineBase` gives the answers
    # of one that cannot): callers read it the same way everywhere, never probe for it.

    on_step: Callable[[int], None] | None
    """Set by the metrics: called with each decode step's batch size (engines that step)."""
    on_migration: Callable[[str], None] | None
    """Set by the metrics: called with each move of a sequence to another replica's outcome
    (gateways: engines/upstream/migration.py)."""

    @property
    def restarts(self) -> int | None:
        """Times the engine's process was started again after it died; None: it has none."""
        ...

    async def control(self, call: ControlCall) -> list[ControlAnswer]:
        """vLLM's control plane: the call on every replica, each one's answer; refused by name
        (`UnsupportedParameterError`) by an engine without one, or a call it cannot make."""
        ...

    def hold(self, replicas: Sequence[str], held: bool) -> None:
        """Keep `replicas` out of routing (a rolling update pauses them), or put them back."""
        ...

    def held(self) -> frozenset[str]:
        """The replicas held out of routing now (a rolling update that stopped left them)."""
        ...

    @property
    def paused(self) -> str | None:
        """How the control plane paused the engine, as this box remembers it; None: not
        paused, or not remembered (SGLang's cannot say: ask `is_paused`)."""
        ...

    def adapters(self) -> dict[str, str]:
        """The LoRA adapters served now that a request may name as its model (name -> path,
        the adapter's version)."""
        ...


class EngineBase:
    """The optional part of `Engine` as an engine without it answers: no control plane, no
    replicas to hold, no adapters, no process of its own. Engines subclass it and override
    what they do."""

    on_step: Callable[[int], None] | None = None
    on_migration: Callable[[str], None] | None = None

    @property
    def info(self) -> EngineInfo:
        raise NotImplementedError

    @property
    def restarts(self) -> int | None:
        return None

    async def control(self, call: ControlCall) -> list[ControlAnswer]:
        raise UnsupportedParameterError(
            f"model {self.info.model!r}: its engine has no control plane ({call.op})",
            param=call.op)

    def hold(self, replicas: Sequence[str], held: bool) -> None:
        return None

    def held(self) -> frozenset[str]:
        return frozenset()

    @property
    def paused(self) -> str | None:
        return None

    def adapters(self) -> dict[str, str]:
        return {}



def check_prompt(prompt: Sequence[int], info: EngineInfo) -> None:
    """What every engine refuses itself, so one bad prompt never reaches a batch or an upstream
    (serving checks these first, with the request's own param paths)."""
    if not prompt:
        raise InvalidRequestError("the prompt is empty", param="prompt")
    if len(prompt) >= info.max_model_len:
        raise ContextLengthExceededError(
            f"a prompt of {len(prompt)} tokens leaves no room in {info.max_model_len}")
    if min(prompt) < 0 or max(prompt) >= info.vocab_size:
        raise InvalidTokenIdError("a prompt id is outside the vocabulary")


@dataclass(frozen=True)
class ControlCall:
    """One control-plane call, in vLLM's terms: its name (`CONTROL_OPS`), query and JSON body
    as the client sent them."""

    op: str
    query: tuple[tuple[str, str], ...] = ()
    body: Any = None
    replicas: tuple[str, ...] | None = None
    """The replicas (by name) it reaches; None: every one (a rolling update reaches a few)."""


@dataclass(frozen=True)
class ControlAnswer:
    """One replica's answer to a control call (its HTTP status and JSON body)."""

    replica: str
    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

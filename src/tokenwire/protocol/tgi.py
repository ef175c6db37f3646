"""Wire models of Text Generation Inference's generation API: `POST /generate`,
`POST /generate_stream` and `POST /` (TGI v3.3.7's `router/src/lib.rs`: `GenerateRequest`,
`GenerateParameters`, `GenerateResponse`, `StreamResponse`, `ErrorResponse`), as
`huggingface_hub`'s `InferenceClient.text_generation` sends and reads them (docs/api/tgi.md).

Types are TGI's (Rust's): an unsigned field takes no negative number and a `bool` no null, each
a 422 as TGI's deserializer gives. Values (a temperature of 0, too many stop strings) are checked
by the service, with TGI's messages, so that a stream answers them in-band as TGI does.

Differences from TGI, on purpose: `inputs` may also be a list of token ids (tokenwire's; TGI
takes text only), `model` names one of several served models (TGI serves one), and a field TGI
does not know is refused by name (TGI ignores it).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, RootModel, StrictInt

from ._base import RequestModel, ResponseModel
from .common import TokenId

__all__ = [
    "TGIBestOfSequence",
    "TGICompatResponse",
    "TGIDetails",
    "TGIErrorResponse",
    "TGIGenerateRequest",
    "TGIGenerateResponse",
    "TGIGrammar",
    "TGIParameters",
    "TGIPrefillToken",
    "TGIStreamDetails",
    "TGIStreamResponse",
    "TGIToken",
]

_U32 = Annotated[StrictInt, Field(ge=0, lt=2**32)]
_U64 = Annotated[StrictInt, Field(ge=0, lt=2**64)]


class TGIGrammar(RequestModel):
    """TGI's `GrammarType`: `json` (alias `json_object`: a JSON schema, or its text), `regex`,
    or `json_schema` (`{"name"?, "schema"}`)."""

    type: Literal["json", "json_object", "regex", "json_schema"]
    value: Any


class TGIParameters(RequestModel):
    """TGI's `GenerateParameters`. Absent from the request, TGI samples (`do_sample: true`);
    present, each field missing takes the default below."""

    best_of: _U64 | None = None
    """Sample this many sequences and answer the one with the highest mean token logprob, the
    others in `details.best_of_sequences` (whole answers only)."""
    temperature: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: Annotated[StrictInt, Field(ge=-(2**31), lt=2**31)] | None = None
    top_p: float | None = None
    typical_p: float | None = None
    """Refused by name: no engine of tokenwire's samples typically."""
    do_sample: bool = False
    """Sample (else greedy, unless a sampling knob is set: TGI's rule)."""
    max_new_tokens: _U32 | None = None
    """None: as many as the context leaves."""
    return_full_text: bool | None = None
    """Prefix `generated_text` with `inputs`; None: false on /generate and /generate_stream,
    true on `POST /` (TGI's)."""
    stop: list[str] = []
    """Stop strings, kept in `generated_text`; the token that completes one is the last of
    `tokens` (TGI's rule: the output must end with it)."""
    truncate: Annotated[StrictInt, Field(ge=0)] | None = None
    """Keep only the last this many tokens of the prompt."""
    watermark: bool = False
    """Refused by name when true."""
    details: bool = False
    """Answer each generated token (`id`, `text`, `logprob`, `special`), the finish reason,
    the seed."""
    decoder_input_details: bool = False
    """Also each prompt token with its logprob (`details.prefill`; the first's is null), from
    the engine's prompt scoring; whole answers only."""
    seed: _U64 | None = None
    top_n_tokens: _U32 | None = None
    """Each generated token's most likely alternatives (`top_tokens`)."""
    grammar: TGIGrammar | None = None
    """A JSON schema the output follows (`json`, `json_object`, `json_schema`); `regex` is
    refused by name."""
    adapter_id: str | None = None
    """A LoRA adapter the server serves (by the name `/v1/models` lists) samples the request."""


class TGIGenerateRequest(RequestModel):
    """The body of all three routes (`stream` matters only on `POST /`)."""

    inputs: str | list[TokenId]
    """The prompt as text (encoded by the model's tokenizer, control-token strings parsed, its
    BOS first where it adds one), or, tokenwire's addition, as token ids (sent as they are)."""
    parameters: TGIParameters | None = None
    stream: bool = False
    """`POST /`: stream the answer (TGI's `CompatGenerateRequest`); ignored by the other two."""
    model: str | None = None
    """tokenwire's addition: which served model (or LoRA adapter); None, the only one."""

    default_parameters: ClassVar[dict[str, Any]] = {"do_sample": True}
    """What TGI uses when `parameters` is absent (`default_parameters()`)."""


# -- responses --------------------------------------------------------------------------------


class TGIPrefillToken(ResponseModel):
    id: int
    text: str
    """The token decoded alone, control tokens as their text."""
    logprob: float | None
    """Its logprob given the tokens before it; null for the first (nothing predicts it)."""


class TGIToken(ResponseModel):
    id: int
    """The exact id the engine sampled."""
    text: str
    """The text it adds to the output (`""` for a piece of a character the next ids finish);
    a control token's own text."""
    logprob: float | None
    """Its logprob under the model's distribution; null where the engine gives none."""
    special: bool
    """A control token of the tokenizer (EOS, chat markers)."""


class TGIBestOfSequence(ResponseModel):
    omit_if_none = frozenset({"top_tokens"})
    generated_text: str
    finish_reason: str
    generated_tokens: int
    seed: int | None
    prefill: list[TGIPrefillToken]
    tokens: list[TGIToken]
    top_tokens: list[list[TGIToken]] | None = None


class TGIDetails(ResponseModel):
    omit_if_none = frozenset({"best_of_sequences", "top_tokens"})
    finish_reason: str
    """"length", "eos_token" or "stop_sequence" (and tokenwire's "content_filter" where the
    server's content policy ended the output)."""
    generated_tokens: int
    """Every generated token, the one that ended the output included."""
    seed: int | None
    """The seed the sequence was sampled with (draw it again with this seed); null when greedy."""
    prefill: list[TGIPrefillToken]
    tokens: list[TGIToken]
    best_of_sequences: list[TGIBestOfSequence] | None = None
    top_tokens: list[list[TGIToken]] | None = None
    """Per generated token, its most likely alternatives, most likely first (`top_n_tokens`)."""


class TGIGenerateResponse(ResponseModel):
    omit_if_none = frozenset({"details"})
    generated_text: str
    """The generated ids' text, control tokens left out (prefixed with `inputs` when
    `return_full_text`)."""
    details: TGIDetails | None = None
    """With `details` or `decoder_input_details`."""


class TGICompatResponse(RootModel[list[TGIGenerateResponse]]):
    """`POST /` unstreamed: a list holding the one answer (TGI's)."""


class TGIStreamDetails(ResponseModel):
    finish_reason: str
    generated_tokens: int
    seed: int | None
    input_length: int
    """The prompt's tokens (after `truncate`)."""


class TGIStreamResponse(ResponseModel):
    """One event per generated token; the last carries the text and, with `details`, these."""

    omit_if_none = frozenset({"top_tokens"})
    index: int
    """1 for the first token, one more for each."""
    token: TGIToken
    top_tokens: list[TGIToken] | None = None
    generated_text: str | None = None
    details: TGIStreamDetails | None = None


class TGIErrorResponse(ResponseModel):
    """TGI's error body (HTTP errors, and in-band in a stream)."""

    omit_if_none = frozenset({"param", "code"})
    error: str
    error_type: str
    """"validation" (422), "overloaded" (429), "generation" (424), or the code of an error
    TGI has no type for (`invalid_api_key`, `request_too_large`, `method_not_allowed`)."""
    param: str | None = None
    """tokenwire's addition: the field at fault, as TGI's body names it (`parameters.top_k`)."""
    code: str | None = None
    """tokenwire's addition: its error code (docs/api.md#errors)."""

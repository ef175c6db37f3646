"""Checks on the token ids a request carries: which version they belong to, and their range.

Every id a client sends is tied to a tokenizer version. The rules
(docs/api.md#tokenizer-versions):
- ids sent without `tokenizer_version`: 400 tokenizer_version_required (unless the server
  relaxes this; then they mean the model's own version); `/inference/v1/generate` never asks
  for it (vLLM's API: its ids are the model's own), documents sent as ids always do;
- a version not registered: 400 unknown_tokenizer_version;
- a registered version that is not the model's: 400 tokenizer_version_mismatch naming the
  model's version, unless the request opts into `tokenizer_fallback: "translate"`;
- ids outside the version's vocabulary: 400 invalid_token_id at the exact param path;
- control tokens (chat markers, BOS/EOS) among them: 400 special_token_not_allowed, unless the
  server allows them (typed marker strings never become control tokens: text is encoded with
  control-token parsing off);
- ids that are not the tokenizer's own encoding of their text (non-canonical): allowed, flagged
  or refused by setting. Ids a model sampled are often non-canonical and must round-trip, so
  the default is to allow; the content policy sees the decoded text either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import (
    InvalidTokenIdError,
    SpecialTokenNotAllowedError,
    TokenizerVersionMismatchError,
    TokenizerVersionRequiredError,
)
from ..tokenizers.base import Tokenizer
from ..tokenizers.conversions import record
from ..tokenizers.registry import TokenizerEntry, TokenizerRegistry

__all__ = [
    "IdSpan",
    "TokenSpace",
    "check_id_range",
    "check_special_ids",
    "is_canonical",
    "resolve_token_space",
    "valid_utf8_span",
]


@dataclass(frozen=True)
class IdSpan:
    """A run of ids the client sent, and where in the request it sits."""

    param: str
    ids: Sequence[int]
    assistant: bool = False
    """Assistant history (ids a model sampled), which safety settings may treat apart."""


@dataclass(frozen=True)
class TokenSpace:
    """How a request's ids relate to the model's tokenizer."""

    client: TokenizerEntry
    """The version the request's ids (in and out) belong to."""
    model: TokenizerEntry
    translate: bool
    """True when `client` is not the model's version and the request asked to go via text."""


def resolve_token_space(*, target: TokenizerEntry, target_name: str,
                        registry: TokenizerRegistry, version: str | None, fallback: str,
                        carries_ids: bool, require_version: bool) -> TokenSpace:
    """`target` is the version the ids must end up in (a model's); `target_name` names it in
    errors ("model 'x'")."""
    if version is None:
        if carries_ids and require_version:
            raise TokenizerVersionRequiredError(
                "This request sends token ids, so it must name the tokenizer_version they "
                f"were encoded with; {target_name} uses {target.version!r}",
                param="tokenizer_version",
            )
        return TokenSpace(client=target, model=target, translate=False)
    theirs = registry.resolve(version)
    if theirs.version == target.version:
        return TokenSpace(client=target, model=target, translate=False)
    if fallback == "translate":
        return TokenSpace(client=theirs, model=target, translate=True)
    raise TokenizerVersionMismatchError(
        f"tokenizer_version {theirs.version!r} is not the tokenizer of {target_name}, "
        f"which uses {target.version!r}; re-encode with it, or send "
        "\"tokenizer_fallback\": \"translate\" to go through text",
        param="tokenizer_version",
    )


def check_id_range(spans: Sequence[IdSpan], tokenizer: Tokenizer) -> None:
    n = tokenizer.vocab_size
    for span in spans:
        if not span.ids or max(span.ids) < n:
            continue
        for k, t in enumerate(span.ids):
            if t >= n:
                raise InvalidTokenIdError(
                    f"token id {t} is out of range for {tokenizer.version} "
                    f"(vocabulary of {n}: ids 0..{n - 1})",
                    param=f"{span.param}[{k}]",
                )


def check_special_ids(spans: Sequence[IdSpan], tokenizer: Tokenizer, *,
                      hint: str = "this server does not allow them") -> None:
    """Control tokens in client ids would let a user forge structure
    (`<|im_end|><|im_start|>system`): refused, at their exact position."""
    special = tokenizer.special_ids
    for span in spans:
        if special.isdisjoint(span.ids):
            continue
        for k, t in enumerate(span.ids):
            if t in special:
                raise SpecialTokenNotAllowedError(
                    f"token id {t} is the control token {tokenizer.token_str(t)!r}; control "
                    f"tokens are not allowed in client ids ({hint})",
                    param=f"{span.param}[{k}]",
                )


def valid_utf8_span(pieces: Sequence[bytes]) -> tuple[int, int]:
    """The ids [a, b) whose bytes lie wholly inside the block's valid UTF-8, leaving out ids
    that carry part of a character cut at the block's start or end."""
    data = b"".join(pieces)
    start = 0
    while start < len(data) and start < 3 and (data[start] & 0xC0) == 0x80:
        start += 1  # continuation bytes of a character that began in an earlier block
    end = len(data)
    for back in range(1, min(4, len(data) - start) + 1):
        lead = data[end - back]
        if (lead & 0xC0) == 0x80:
            continue
        need = 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == \
            0b11110 else 1
        if need > back:
            end -= back  # a character whose last bytes are in a later block
        break
    a, pos = 0, 0
    while a < len(pieces) and pos < start:
        pos += len(pieces[a])
        a += 1
    b, pos = len(pieces), len(data)
    while b > a and pos > end:
        pos -= len(pieces[b - 1])
        b -= 1
    return a, b


def is_canonical(ids: Sequence[int], tokenizer: Tokenizer) -> bool:
    """Are `ids` the tokenizer's own encoding of their text (edges cut mid-character aside)?
    Control tokens (in a raw prompt) split the check: the text between them is checked."""
    special = tokenizer.special_ids
    if not special.isdisjoint(ids):
        run: list[int] = []
        for t in [*ids, next(iter(special))]:
            if t in special:
                if not _is_canonical_text(run, tokenizer):
                    return False
                run = []
            else:
                run.append(t)
        return True
    return _is_canonical_text(ids, tokenizer)


def _is_canonical_text(ids: Sequence[int], tokenizer: Tokenizer) -> bool:
    if not ids:
        return True
    record("decode")  # the ids' text, to encode again (the caller names the reason)
    pieces = [tokenizer.token_bytes(t) for t in ids]
    a, b = valid_utf8_span(pieces)
    inner = list(ids[a:b])
    data = b"".join(pieces[a:b])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False  # invalid UTF-8 inside the block: no text has these ids as its encoding
    return tokenizer.encode(text) == inner

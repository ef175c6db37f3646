"""Checks on the token ids a request carries: which version they belong to, and their range.

Every id a client sends is tied to a tokenizer version. The rules (API.md):
- ids sent without `tokenizer_version`: 400 tokenizer_version_required (unless the server
  relaxes this; then they mean the model's own version);
- a version not registered: 400 unknown_tokenizer_version;
- a registered version that is not the model's: 400 tokenizer_version_mismatch naming the
  model's version, unless the request opts into `tokenizer_fallback: "translate"`;
- ids outside the version's vocabulary: 400 invalid_token_id at the exact param path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import (
    InvalidTokenIdError,
    TokenizerVersionMismatchError,
    TokenizerVersionRequiredError,
)
from ..tokenizers.hf import HFTokenizer
from ..tokenizers.registry import TokenizerEntry, TokenizerRegistry

__all__ = ["IdSpan", "TokenSpace", "check_id_range", "resolve_token_space"]


@dataclass(frozen=True)
class IdSpan:
    """A run of ids the client sent, and where in the request it sits."""

    param: str
    ids: Sequence[int]


@dataclass(frozen=True)
class TokenSpace:
    """How a request's ids relate to the model's tokenizer."""

    client: TokenizerEntry
    """The version the request's ids (in and out) belong to."""
    model: TokenizerEntry
    translate: bool
    """True when `client` is not the model's version and the request asked to go via text."""

    @property
    def source(self) -> str:
        return "translated" if self.translate else "sampled"


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


def check_id_range(spans: Sequence[IdSpan], tokenizer: HFTokenizer) -> None:
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

"""Content policy: one verdict for the same content, whatever path it came by.

Text is normalized before rules see it, so look-alike spellings get the verdict of the plain
one: NFKC (full-width, ligatures, compatibility forms), case folding, invisible format
characters (zero-width spaces/joiners, bidi marks) removed, common Cyrillic/Greek look-alikes
mapped to Latin, and every run of whitespace made one space. Phrases are also matched against a
"leet" reading (0->o, 1->i, 3->e, 4->a, 5->s, 7->t, @->a, $->s).

Token input reaches a policy as the decoded text of its ids, so canonical ids, non-canonical ids
and text all give one string, hence one verdict.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["ContentPolicy", "NoPolicy", "RulePolicy", "Violation", "load_policy", "normalize"]

_LOOKALIKES = str.maketrans({
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p",
    "с": "c", "т": "t", "у": "y", "х": "x", "і": "i", "ї": "i", "ј": "j", "ѕ": "s", "ԁ": "d",
    "ԛ": "q", "ԝ": "w", "ӏ": "l", "ɡ": "g",
    # Greek
    "α": "a", "β": "b", "ε": "e", "η": "n", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p",
    "τ": "t", "υ": "u", "χ": "x", "ω": "w", "ς": "s",
    # Latin variants
    "ı": "i", "ł": "l", "ø": "o", "đ": "d", "ħ": "h",
})
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a",
                       "$": "s", "!": "i", "|": "l"})
_SPACE = re.compile(r"\s+")


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    # decompose to drop accents a look-alike may carry (é -> e), then recompose nothing
    text = "".join(c for c in unicodedata.normalize("NFKD", text)
                   if not unicodedata.combining(c))
    return _SPACE.sub(" ", text.translate(_LOOKALIKES)).strip()


@dataclass(frozen=True)
class Violation:
    rule: str
    """Which rule matched (the phrase or pattern as configured)."""


@runtime_checkable
class ContentPolicy(Protocol):
    """One method: the verdict on a text. A classifier implements the same interface."""

    check_input: bool
    """Check requests: false where the policy has nothing to look for, so that token input is
    not decoded for it (the token-native path converts nothing)."""

    check_output: bool
    """Also check what the model writes (a choice it stops ends with finish_reason
    content_filter; the others go on)."""

    def check(self, text: str) -> Violation | None: ...


class NoPolicy:
    check_input = False
    check_output = False

    def check(self, text: str) -> Violation | None:
        return None


class RulePolicy:
    """Blocked phrases (matched on word boundaries) and regular expressions, on normal form."""

    def __init__(self, phrases: Sequence[str] = (), patterns: Sequence[str] = (), *,
                 check_output: bool = False):
        self.check_output = check_output
        self._phrases = [(p, re.compile(rf"(?<!\w){re.escape(normalize(p))}(?!\w)"))
                         for p in phrases if normalize(p)]
        self._patterns = [(p, re.compile(p)) for p in patterns]
        self.check_input = bool(self._phrases or self._patterns)

    def check(self, text: str) -> Violation | None:
        norm = normalize(text)
        leet = norm.translate(_LEET)
        for name, rx in self._phrases:
            if rx.search(norm) or rx.search(leet):
                return Violation(name)
        for name, rx in self._patterns:
            if rx.search(norm):
                return Violation(name)
        return None

    @classmethod
    def from_file(cls, path: Path) -> RulePolicy:
        """`{"blocked_phrases": [...], "blocked_patterns": [...], "check_output": false}`"""
        spec = json.loads(path.read_text())
        unknown = set(spec) - {"blocked_phrases", "blocked_patterns", "check_output"}
        if unknown:
            raise ValueError(f"{path}: unknown content policy keys {sorted(unknown)}")
        return cls(spec.get("blocked_phrases", []), spec.get("blocked_patterns", []),
                   check_output=bool(spec.get("check_output", False)))


def load_policy(path: Path | None) -> ContentPolicy:
    return RulePolicy.from_file(path) if path is not None else NoPolicy()

"""Structured output on the embedded engine: a request's `Grammar` compiled by llguidance into
a token mask, one step at a time.

llguidance (a grammar backend of vLLM and SGLang) compiles JSON schemas, Lark grammars and GBNF
against the model's own vocabulary; each step it fills a bitmask of the ids that keep the output
inside the grammar, and the engine writes -inf over the rest of the raw logits before its
sampler chain runs (raw logprobs are read first, as the llama.cpp grammar sampler had it;
vLLM reads them after its bitmask: docs/api/chat.md). Compiling happens at
admission: what llguidance cannot enforce is a 400 naming the field (and, for a schema keyword,
where it is), never a stuck engine. Compiled grammars are kept per model by their text, so a
schema repeated across a rollout's requests compiles once; each sequence walks its own copy.
"""

from __future__ import annotations

import ctypes
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import llama_cpp as L
import llguidance
import llguidance.numpy
import numpy as np
from llguidance.gbnf_to_lark import gbnf_to_lark

from ..base import Grammar, StructuralTag
from ._unique import Path, Scanner, split_unique

__all__ = ["Guide", "GuideError", "Guides", "lark_of"]

WHITESPACE = r" ?"
"""Whitespace a JSON value may hold between its tokens: one optional space, the rule of the
llama.cpp converter this engine used before (llama-cpp-python's `space ::= " "?`). Compact:
an unbounded run lets a sampled model pad forever, and newlines and indents cost tokens (a
parallel tool call pretty-printed took half again as many)."""
_CACHED = 256
"""Compiled grammars kept per model (least recently used out)."""
_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \[(.*?)\]')


class GuideError(ValueError):
    """llguidance cannot compile a grammar; `param` names where (the field, or a schema's
    keyword under it); `unsupported`: valid, but beyond what llguidance enforces."""

    def __init__(self, message: str, param: str, *, unsupported: bool = False):
        super().__init__(message)
        self.param = param
        self.unsupported = unsupported


def _schema(text: str, param: str) -> Any:
    """A schema with our whitespace rule; a client's own llguidance options are refused (its
    `lenient` would drop keywords without a word)."""
    schema = json.loads(text)
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        return schema  # llguidance names what is wrong
    if "x-guidance" in schema:
        raise GuideError("llguidance's options are this server's to set", f"{param}.x-guidance",
                         unsupported=True)
    return {**schema, "x-guidance": {"whitespace_pattern": WHITESPACE}}


def _literal(text: str, specials: Mapping[str, int]) -> str:
    """`text` as Lark, a marker token's text as its id (`<[id]>`): no text can produce a
    control token, and text forced by a grammar is spelled by the tokenizer's ordinary pieces,
    so a format's markers (control or user-defined tokens) are forced as the tokens the model
    itself samples for them."""
    if not text:
        return '""'
    found = [m for m in specials if m in text]
    if not found:
        return json.dumps(text, ensure_ascii=False)
    parts = re.split("(" + "|".join(re.escape(m) for m in sorted(found, key=len, reverse=True))
                     + ")", text)
    return " ".join(f"<[{specials[p]}]>" if p in specials else json.dumps(p, ensure_ascii=False)
                    for p in parts if p)


def _tag(tag: StructuralTag, param: str, specials: Mapping[str, int], skip: int = 0) -> str:
    """`begin` (less its first `skip` characters), a JSON value valid against the schema,
    `end`."""
    body = json.dumps(_schema(tag.schema, tag.param or param), ensure_ascii=False)
    begin, end = tag.begin[skip:], tag.end
    return (f"{_literal(begin, specials) + ' ' if begin else ''}%json {body}"
            f"{' ' + _literal(end, specials) if end else ''}")


def _unique(grammar: Grammar) -> tuple[str | None, list[Path]]:
    """A schema's text without the `uniqueItems` _unique.py keeps, and where those arrays are."""
    if grammar.json_schema is None:
        return None, []
    schema, paths = split_unique(json.loads(grammar.json_schema))
    return json.dumps(schema, ensure_ascii=False), paths


def lark_of(grammar: Grammar, specials: Mapping[str, int] | None = None,
            control: Collection[str] = ()) -> str:
    """The grammar in llguidance's Lark: a JSON schema's value, the client's GBNF, or tagged
    spans (tool calls): exactly one (`parallel`: one or more, `separator` apart) inside the
    `section`; lazy (`triggers`): free text until a trigger, the spans from the trigger on,
    nothing after. `specials`: marker tokens' texts and ids, matched as ids (`control`: those
    that no text spells, control tokens; the others, user-defined tokens, are text too). A
    grammar with `reasoning` holds after the model's reasoning: free text up to the end marker
    (from the start marker, unless the prompt opened it; required under a budget), then
    whitespace, then the grammar (vLLM starts its grammar where its reasoning parser sees the
    reasoning end, likewise)."""
    specials = specials or {}
    text = _lark(grammar, specials, control)
    if grammar.reasoning is None:
        return text
    thought = grammar.reasoning
    text = _renamed(text, "start", "tw_answer")
    opened = "" if thought.inside else f"{_literal(thought.start, specials)} "
    end = _literal(thought.end, specials)
    cap = f"max_tokens={thought.budget}" if thought.budget is not None else ""
    if thought.end in specials:
        # the marker is one token: the thought is any text without the marker's (a control
        # token's, no text spells), so that token alone ends it
        text_re = "/(.|\\n)*/"
        if thought.end not in control:
            marker = re.escape(thought.end).replace("/", "\\/")
            text_re += f" & ~/(.|\\n)*{marker}(.|\\n)*/"
        rule = f"tw_thought{f'[{cap}]' if cap else ''}: TW_THOUGHT\nTW_THOUGHT: {text_re}"
    else:  # text over several tokens: the thought stops where the marker's text begins
        stop = f"stop={json.dumps(thought.end, ensure_ascii=False)}"
        rule = f"tw_thought[{', '.join(a for a in (stop, cap) if a)}]: /(.|\\n)*/"
    # a budget ends the thought after that many tokens, and then the marker is all that may
    # follow; bounded, the thought is required (free text after none would be unbounded)
    lines = [f"start: {opened}tw_thought {end} TW_GAP tw_answer" if thought.inside
             or thought.budget is not None
             else f"start: tw_answer | {opened}tw_thought {end} TW_GAP tw_answer",
             rule, "TW_GAP: /[ \\t\\r\\n]*/"]
    return "\n".join(lines) + "\n" + text


def _renamed(lark: str, old: str, new: str) -> str:
    """`lark` with every rule name `old` (its definition and each use) as `new`; string
    literals and /regexes/ left as they are (a client's GBNF, converted, may recurse into its
    root)."""
    out, i = [], 0
    while i < len(lark):
        c = lark[i]
        if c in "\"/":  # a literal or a regex, to its unescaped end
            j = i + 1
            while j < len(lark) and lark[j] != c:
                j += 2 if lark[j] == "\\" else 1
            out.append(lark[i:j + 1])
            i = j + 1
        elif c.isalpha() or c == "_":
            j = i
            while j < len(lark) and (lark[j].isalnum() or lark[j] in "_"):
                j += 1
            out.append(new if lark[i:j] == old else lark[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _lark(grammar: Grammar, specials: Mapping[str, int], control: Collection[str]) -> str:
    if grammar.json_schema is None and grammar.gbnf is None and not grammar.tags:
        return "start: /(.|\\n)*/\n"  # any text (a reasoning budget alone)
    if grammar.json_schema is not None:
        text, _ = _unique(grammar)
        body = json.dumps(_schema(text or "", grammar.param), ensure_ascii=False)
        return f"start: %json {body}\n"
    if grammar.gbnf is not None:
        try:
            return str(gbnf_to_lark(grammar.gbnf))
        except Exception as exc:  # noqa: BLE001 - GbnfToLarkError, and its resolve() raises bare
            # Exceptions (an undefined rule, no root): all of them say the client's grammar
            raise GuideError(f"the grammar does not parse: {exc}", grammar.param) from exc
    tags = grammar.tags
    opening, closing = grammar.section
    lines = [f"tag_{i}: {_tag(t, grammar.param, specials)}" for i, t in enumerate(tags)]
    lines.append("tagged: " + " | ".join(f"tag_{i}" for i in range(len(tags))))
    sep = _literal(grammar.separator, specials) + " " if grammar.separator else ""
    more = f" ({sep}tagged)*" if grammar.parallel else ""
    close = f" {_literal(closing, specials)}" if closing else ""
    if not grammar.triggers:
        head = f"{_literal(opening, specials)} " if opening else ""
        lines.insert(0, f"start: {head}tagged{more}{close}")
        return "\n".join(lines) + "\n"
    # lazy: a lazy lexeme ends at the first trigger in the text; what follows is the rest
    # of a tag (or of the section's opening) that begins with that trigger
    firsts = []
    for k, word in enumerate(grammar.triggers):
        # the text lazily up to the trigger as text (a user-defined token's text is text);
        # a control token ends the text by itself: no lazy lexeme
        head = f"head_{k}[lazy]: TEXT {json.dumps(word, ensure_ascii=False)}"
        if word in control:
            head = f"head_{k}: TEXT {_literal(word, specials)}"
        lines.append(head)
        if opening:
            rest = _literal(opening[len(word):], specials) + " " if opening[len(word):] else ""
            firsts.append(f"head_{k} {rest}tagged")
            continue
        rests = [f"rest_{k}_{i}" for i, t in enumerate(tags) if t.begin.startswith(word)]
        lines += [f"rest_{k}_{i}: {_tag(t, grammar.param, specials, len(word))}"
                  for i, t in enumerate(tags) if t.begin.startswith(word)]
        firsts.append(f"head_{k} ({' | '.join(rests)})")
    lines.insert(0, f"start: TEXT | ({' | '.join(firsts)}){more}{close}")
    lines.append("TEXT: /(.|\\n)*/")
    return "\n".join(lines) + "\n"


def _where(schema: Any, key: str, at: str = "") -> str | None:
    """Where `key` is used as a keyword in `schema` (dotted, as errors name fields)."""
    if isinstance(schema, dict):
        if key in schema:
            return f"{at}.{key}" if at else key
        for k, v in schema.items():
            if k in ("const", "enum", "default", "examples"):
                continue  # values, not schemas
            found = _where(v, key, f"{at}.{k}" if at else k)
            if found is not None:
                return found
    elif isinstance(schema, list):
        for i, v in enumerate(schema):
            found = _where(v, key, f"{at}[{i}]")
            if found is not None:
                return found
    return None


def _refusal(grammar: Grammar, error: str) -> GuideError:
    """llguidance's reason, and where: an unimplemented schema keyword by its path."""
    message = error.strip().splitlines()[0] if error.strip() else "the grammar does not compile"
    param = grammar.param
    found = _UNIMPLEMENTED.search(error)
    unsupported = bool(found) or "not supported" in error or "Unknown format" in error
    if found:
        keys = json.loads(f"[{found.group(1)}]")
        schemas = [(grammar.json_schema, param)] if grammar.json_schema is not None \
            else [(t.schema, t.param or param) for t in grammar.tags]
        for text, field in schemas:
            at = _where(json.loads(text), keys[0]) if text else None
            if at is not None:
                param = f"{field}.{at}"
                break
        message = (f"the JSON schema keyword {keys[0]!r} cannot be enforced by this server's "
                   "grammar library (llguidance)" + (
                       "; uniqueItems is kept for arrays of free strings ({\"type\": \"string\"}"
                       " items) only" if keys[0] == "uniqueItems" else ""))
    return GuideError(message, param, unsupported=unsupported)


def _index(vocab: Any, n_vocab: int, eos: list[int]
           ) -> tuple[llguidance.LLTokenizer, dict[str, int], frozenset[str]]:
    """llguidance's reading of llama.cpp's vocabulary: its `llamacpp.lltokenizer_from_vocab`,
    except that only control tokens are special. A user-defined token (Qwen's `<tool_call>`,
    SmolLM2's `<file_sep>`) stays its text, which grammar literals and free text match, as
    llama.cpp's grammar sampler had it: marked special, a tool call's tag would have to be
    spelled byte by byte."""
    size = 16 * 1024
    buf = ctypes.create_string_buffer(size + 1)
    tokens = []
    specials: dict[str, int] = {}
    control: set[str] = set()
    for t in range(n_vocab):
        n = L.llama_token_to_piece(vocab, t, buf, size, 0, True)
        if n < 0:
            raise ValueError(f"token {t} does not fit {size} bytes")
        piece = buf.raw[:n]
        attr = L.llama_vocab_get_attr(vocab, t)
        if attr & (L.LLAMA_TOKEN_ATTR_CONTROL | L.LLAMA_TOKEN_ATTR_USER_DEFINED):
            specials.setdefault(piece.decode(errors="replace"), t)
        if attr & L.LLAMA_TOKEN_ATTR_CONTROL:
            control.add(piece.decode(errors="replace"))
            piece = b"\xff" + piece  # llguidance's mark of a special token
        tokens.append(piece)
    tokenize = ctypes.cast(L.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
    index: llguidance.LLTokenizer = llguidance.LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
        tokens=tokens, vocab_ptr=vocab, tokenize_fptr=tokenize, eos_token=eos, slices=None)
    specials.pop("", None)
    return index, specials, frozenset(control)


class Guides:
    """One model's grammar compiler: its vocabulary as llguidance reads it (built on first use,
    ~0.5 s), and its compiled grammars."""

    def __init__(self, vocab: Any, n_vocab: int, eos_ids: Sequence[int],
                 lock: threading.Lock | None = None):
        self._vocab = vocab
        self._n_vocab = n_vocab
        self._eos = list(eos_ids)
        self._lock = lock or threading.Lock()  # held while llama.cpp's vocabulary is read
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._specials: dict[str, int] = {}
        self._control: frozenset[str] = frozenset()
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._quoted: list[tuple[int, bytes]] | None = None
        self._guard = threading.Lock()

    def _tok(self) -> llguidance.LLTokenizer:
        with self._guard:
            if self._tokenizer is None:
                with self._lock:
                    self._tokenizer, self._specials, self._control = _index(
                        self._vocab, self._n_vocab, self._eos)
            return self._tokenizer

    @property
    def built(self) -> bool:
        """The vocabulary's index is built (grammars have been compiled)."""
        return self._tokenizer is not None

    def warm(self) -> None:
        """Build the vocabulary's index now."""
        self._tok()

    def compile(self, grammar: Grammar) -> llguidance.LLMatcher:
        """The grammar's matcher at its start (shared: `start` copies it); raises `GuideError`."""
        self._tok()
        text = lark_of(grammar, self._specials, self._control)
        with self._guard:
            hit = self._compiled.get(text)
            if hit is not None:
                self._compiled.move_to_end(text)
                return hit
        try:
            lark = llguidance.LLMatcher.grammar_from_lark(text)
        except ValueError as exc:
            raise _refusal(grammar, str(exc)) from exc
        matcher = llguidance.LLMatcher(self._tok(), lark, log_level=0)
        if matcher.is_error():
            raise _refusal(grammar, matcher.get_error())
        with self._guard:
            self._compiled[text] = matcher
            while len(self._compiled) > _CACHED:
                self._compiled.popitem(last=False)
        return matcher

    def start(self, grammar: Grammar) -> Guide:
        matcher = self.compile(grammar).deep_copy()
        _, paths = _unique(grammar)
        return Guide(matcher, self._n_vocab, self._tok(),
                     (Scanner(paths), self._closers()) if paths else None)

    def _closers(self) -> list[tuple[int, bytes]]:
        """The ids whose bytes hold a quote (what may close a JSON string), with their bytes."""
        with self._guard:
            if self._quoted is None:
                tok = self._tokenizer
                assert tok is not None
                pieces = ((t, tok.decode_bytes([t])) for t in range(tok.vocab_size))
                self._quoted = [(t, b) for t, b in pieces if b'"' in b]
            return self._quoted


class Guide:
    """One sequence's walk through its grammar: the mask before each step, the sampled id after."""

    def __init__(self, matcher: llguidance.LLMatcher, n_vocab: int,
                 tokenizer: llguidance.LLTokenizer,
                 unique: tuple[Scanner, list[tuple[int, bytes]]] | None = None):
        self._matcher = matcher
        self._bits = llguidance.numpy.allocate_token_bitmask(1, n_vocab)
        self._tokenizer = tokenizer
        self._unique = unique

    def mask(self, logits: np.ndarray) -> None:
        """-inf over the ids the grammar does not allow next (`logits`: the raw row, in place),
        and over those that would repeat an item of an array kept unique."""
        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._bits)
        if self._matcher.is_error():  # (its mask then allows only the end: never end silently)
            raise RuntimeError(self._matcher.get_error())
        llguidance.numpy.apply_token_bitmask_inplace(logits, self._bits)
        if self._unique is not None:
            scanner, closers = self._unique
            scanner.ban(logits, closers)

    def accept(self, token: int) -> None:
        """Move past a sampled id; raises if the grammar did not allow it (a bug, not the
        client's)."""
        if not self._matcher.consume_token(token):
            raise RuntimeError(f"the grammar did not allow id {token}: "
                               f"{self._matcher.get_error()}")
        if self._unique is not None:
            self._unique[0].feed(self._tokenizer.decode_bytes([token]))

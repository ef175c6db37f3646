from __future__ import annotations

import pytest

from tests.tokenizers.test_gguf_families import OUTCOMES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The tokenizer families of llama.cpp's vocabulary files: how many are exact, and why
    the others are refused."""
    if not OUTCOMES:
        return
    exact = sum(v.startswith("exact") for v in OUTCOMES.values())
    terminalreporter.section("GGUF tokenizer families (llama.cpp's vocabulary files)")
    terminalreporter.write_line(f"{exact} of {len(OUTCOMES)} give llama.cpp's ids exactly")
    for family, outcome in sorted(OUTCOMES.items()):
        terminalreporter.write_line(f"  {family}: {outcome}")

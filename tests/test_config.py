from __future__ import annotations

from pathlib import Path

import pytest

from tokenwire.cli import _parser
from tokenwire.config import Settings, default_model_path
from tokenwire.serving.models import default_model_name


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENWIRE_PORT", "9123")
    monkeypatch.setenv("TOKENWIRE_REQUIRE_TOKENIZER_VERSION", "false")
    s = Settings()
    assert s.port == 9123 and s.host == "127.0.0.1"
    assert s.require_tokenizer_version is False


def test_the_default_model_is_installed() -> None:
    path = default_model_path()
    assert path.is_file() and path.stat().st_size > 50_000_000
    assert Settings().model_path() == path


def test_model_names() -> None:
    assert default_model_name(Path("SmolLM2-135M-Instruct.Q4_1.gguf")) == "SmolLM2-135M-Instruct"
    assert default_model_name(Path("gemma-3-270m-Q4_K_M.gguf")) == "gemma-3-270m"
    assert default_model_name(Path("plain.gguf")) == "plain"


def test_cli_serve_arguments() -> None:
    args = _parser().parse_args(["serve", "--model", "m.gguf", "--port", "9000"])
    assert args.model == Path("m.gguf") and args.port == 9000

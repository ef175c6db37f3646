from __future__ import annotations

from pathlib import Path

import pytest

from tokenwire.cli import _parser
from tokenwire.config import DEFAULT_MODEL_FILE, Settings, default_model_name, default_model_path


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENWIRE_PORT", "9123")
    monkeypatch.setenv("TOKENWIRE_REQUIRE_TOKENIZER_VERSION", "false")
    s = Settings()
    assert s.port == 9123 and s.host == "127.0.0.1"
    assert s.require_tokenizer_version is False


def test_the_default_model_is_installed() -> None:
    path = default_model_path()
    assert path.name == DEFAULT_MODEL_FILE and path.stat().st_size > 50_000_000
    assert path.read_bytes()[:4] == b"GGUF"


def test_model_and_tokenizer_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOKENWIRE_MODEL", raising=False)
    monkeypatch.delenv("TOKENWIRE_TOKENIZER", raising=False)
    assert Settings().model_path().name == DEFAULT_MODEL_FILE
    assert Settings(model=Path("m.gguf")).model_path() == Path("m.gguf")
    monkeypatch.setenv("TOKENWIRE_MODEL", "/models/e.gguf")
    assert Settings().model_path() == Path("/models/e.gguf")
    # the tokenizer is the served GGUF's unless one is named
    assert Settings().tokenizer_path() == Path("/models/e.gguf")
    assert Settings(tokenizer=Path("tok")).tokenizer_path() == Path("tok")


def test_model_names() -> None:
    assert default_model_name(Path("SmolLM2-135M-Instruct.Q4_1.gguf")) == "SmolLM2-135M-Instruct"
    assert default_model_name(Path("gemma-3-270m-Q4_K_M.gguf")) == "gemma-3-270m"
    assert default_model_name(Path("plain.gguf")) == "plain"


def test_cli_serve_arguments() -> None:
    args = _parser().parse_args(["serve", "--model", "m.gguf", "--port", "9000"])
    assert args.model == Path("m.gguf") and args.port == 9000
    assert args.prefix_cache is None  # not given: the setting (environment, default on) decides
    assert _parser().parse_args(["serve", "--no-prefix-cache"]).prefix_cache is False


def test_a_batch_must_hold_every_decoding_sequence() -> None:
    with pytest.raises(ValueError, match="n_batch"):
        Settings(n_parallel=32, n_batch=16)


def test_seeds_are_mixed_not_truncated() -> None:
    from tokenwire.serving.sampling import _seed32, choice_params

    seeds = [_seed32(s) for s in (0, 1, 2**32, 2**32 + 1, -1 % 2**64, 0xFFFFFFFF)]
    assert len(set(seeds)) == len(seeds)
    assert 0xFFFFFFFF not in {_seed32(s) for s in range(100_000)}
    a = [p.seed for p in choice_params(n=3, max_tokens=1, temperature=1, top_p=1, seed=-1,
                                       logprobs=None)]
    assert a == [p.seed for p in choice_params(n=3, max_tokens=1, temperature=1, top_p=1,
                                               seed=-1, logprobs=None)]
    assert len(set(a)) == 3


@pytest.mark.parametrize(("args", "message"), [
    (["--engine", "vllm", "--tokenizer", "x.gguf"], "needs at least one --upstream URL"),
    (["--engine", "vllm", "--upstream", "http://h:8000"], "needs --tokenizer"),
    (["--upstream", "http://h:8000"], "--upstream is for upstream engines"),
    (["--engine", "tgi", "--upstream", "http://h:8000"], "engine: Input should be"),
])
def test_serve_refuses_bad_engine_settings(args: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from tokenwire.cli import main

    assert main(["serve", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokenwire serve: ") and message in err, err


def test_raw_prompts_by_deployment() -> None:
    assert Settings().raw_prompts_allowed(None)  # keyless, loopback
    assert not Settings(host="0.0.0.0").raw_prompts_allowed(None)
    assert not Settings(api_keys=["a"]).raw_prompts_allowed("a")
    assert Settings(api_keys=["a", "b"], raw_prompt_keys=["b"]).raw_prompts_allowed("b")
    assert Settings(api_keys=["a"], raw_prompts="allow").raw_prompts_allowed("a")
    assert not Settings(raw_prompts="deny").raw_prompts_allowed(None)
    assert not Settings(api_keys=["b"], raw_prompt_keys=["b"],
                        raw_prompts="deny").raw_prompts_allowed("b")


def test_serve_refuses_a_file_that_is_not_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A start-up error of the tree (here GGUFFormatError) is one line, not a traceback."""
    from tokenwire.cli import main

    monkeypatch.setenv("TOKENWIRE_TOKENIZER_STORE", str(tmp_path / "store"))

    bad = tmp_path / "model.gguf"
    bad.write_text("not a model")
    assert main(["serve", "--model", str(bad), "--port", "1"]) == 1
    err = capsys.readouterr().err
    assert err == f"tokenwire serve: not starting: {bad} is not a GGUF file\n", err

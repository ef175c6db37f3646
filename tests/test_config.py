from __future__ import annotations

import os
from pathlib import Path

import pytest

from tokenwire.cli import _parser
from tokenwire.config import (
    DEFAULT_MODEL_FILE,
    SHIPPED_MODELS,
    ModelSpec,
    Settings,
    ShippedModel,
    default_model_name,
    default_model_path,
)
from tokenwire.errors import ModelSourceError


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
    assert args.model == ["m.gguf"] and args.port == 9000
    assert args.prefix_cache is None  # not given: the setting (environment, default on) decides
    assert _parser().parse_args(["serve", "--no-prefix-cache"]).prefix_cache is False


def test_a_batch_must_hold_every_decoding_sequence() -> None:
    with pytest.raises(ValueError, match="n_batch"):
        Settings(n_parallel=32, n_batch=16)


def test_seeds_are_mixed_not_truncated() -> None:
    from tokenwire.serving.sampling_params import _seed32, choice_params

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
    (["--return-sampling-mask"], "needs logprobs_mode 'processed_logprobs'"),
    (["--workers", "2", "--no-engine-process"], "--workers needs the embedded engine in a "
     "process of its own"),
    (["--engine", "vllm", "--upstream", "http://h:8000", "--tokenizer", "x.gguf", "--workers",
      "0"], "workers: Input should be greater than or equal to 1"),
])
def test_serve_refuses_bad_engine_settings(args: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from tokenwire.cli import main

    assert main(["serve", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokenwire serve: ") and message in err, err


def test_workers_default_to_the_cores_of_a_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    gateway = {"engine": "vllm", "upstream": ["http://h:8000"], "tokenizer": Path("x.gguf")}
    assert Settings(**gateway).max_workers == 3
    assert Settings(**gateway, workers=1).max_workers == 1
    assert Settings().max_workers == 1  # the embedded engine


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


# -- several models in one server --------------------------------------------------------


def test_each_model_has_its_own_settings_over_the_servers() -> None:
    s = Settings(n_parallel=3, n_threads=2, models=[
        "smollm2-135m", "smollm2-135m,name=small,n_parallel=1,max-model-len=512,n_batch=64",
        {"model": "/m/other.Q8_0.gguf", "prefix_cache": False, "n_threads": 1}])
    first, small, other = s.model_settings()
    assert first.model == default_model_path() and first.served_model_name == \
        "SmolLM2-135M-Instruct" and (first.n_parallel, first.n_threads) == (3, 2)
    assert (small.served_model_name, small.n_parallel, small.max_model_len, small.n_batch,
            small.n_threads) == ("small", 1, 512, 64, 2)
    assert other.model == Path("/m/other.Q8_0.gguf") and other.served_model_name == "other"
    assert other.prefix_cache is False and other.n_threads == 1 and first.prefix_cache
    assert all(m.models == [] for m in (first, small, other))
    # no models: the one `model` (or the default), as before
    assert Settings(model=Path("m.gguf")).model_settings()[0].model == Path("m.gguf")


def test_one_model_keeps_served_model_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOKENWIRE_MODELS", raising=False)
    s = Settings(models=["smollm2-135m"], served_model_name="tiny")
    assert [m.served_model_name for m in s.model_settings()] == ["tiny"]
    monkeypatch.setenv("TOKENWIRE_MODELS", '["smollm2-135m,name=a", {"model": "x.gguf"}]')
    assert [m.served_model_name for m in Settings().model_settings()] == ["a", "x"]


@pytest.mark.parametrize(("models", "extra", "message"), [
    (["a.gguf,n_parallel=0"], {}, "models.0.n_parallel"),
    (["a.gguf,bogus=1"], {}, "models.0.bogus"),
    (["a.gguf,n_parallel"], {}, "'n_parallel' is not KEY=VALUE"),
    (["a.gguf,n_parallel=32,n_batch=16"], {}, "model 'a.gguf': n_batch must be at least"),
    (["a.gguf", "b.gguf"], {"served_model_name": "x"}, "name each one"),
    (["a.gguf"], {"engine": "vllm", "upstream": ["http://h:1"], "tokenizer": Path("t")},
     "a gateway serves its upstream's one model"),
])
def test_bad_model_specs_are_refused(models: list[str], extra: dict[str, object],
                                     message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(models=models, **extra)  # type: ignore[arg-type]


def test_model_sources_that_name_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelSourceError, match="both served as 'SmolLM2-135M-Instruct'"):
        Settings(models=["smollm2-135m", "smollm2-135m"]).model_settings()
    with pytest.raises(ModelSourceError, match="neither a file nor a shipped model"):
        Settings(models=["smollm3"]).model_settings()
    # a shipped model whose package is not installed: the package to install, by name
    monkeypatch.setitem(SHIPPED_MODELS, "absent-1m",
                        ShippedModel("absent-1m-gguf", "absent_1m_gguf", lambda d: d / "m.gguf"))
    with pytest.raises(ModelSourceError, match="needs the 'absent-1m-gguf' package: pip install"):
        Settings(models=["absent-1m"]).model_settings()


def test_a_models_file(tmp_path: Path) -> None:
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    f = tmp_path / "models.toml"
    f.write_text('[[model]]\nmodel = "smollm2-135m"\nname = "s"\nn_parallel = 2\n\n'
                 '[[model]]\nmodel = "sub/g.gguf"\nchat_template = "t.jinja"\n')
    s = Settings(models_file=f, models=["/abs/last.gguf"])
    assert [m.model for m in s.models] == ["smollm2-135m", str(tmp_path / "sub/g.gguf"),
                                           "/abs/last.gguf"]
    assert s.models[1].chat_template == tmp_path / "t.jinja"
    assert [m.n_parallel for m in s.model_settings()] == [2, 4, 4]
    f.write_text('[[model]]\nmodel = "a.gguf"\nn_parallel = "many"\n')
    with pytest.raises(ValueError, match="model 1: n_parallel: Input should be a valid int"):
        Settings(models_file=f)
    f.write_text('model = "a.gguf"\n')
    with pytest.raises(ValueError, match=r"must hold \[\[model\]\] tables only"):
        Settings(models_file=f)


def test_cli_serve_takes_several_models(capsys: pytest.CaptureFixture[str]) -> None:
    from tokenwire.cli import main

    args = _parser().parse_args(["serve", "--model", "smollm2-135m", "--model",
                                 "x.gguf,name=x,n_threads=2", "--models-file", "m.toml"])
    assert args.model == ["smollm2-135m", "x.gguf,name=x,n_threads=2"]
    assert args.models_file == Path("m.toml")
    assert ModelSpec.parse(args.model[1]) == ModelSpec(model="x.gguf", name="x", n_threads=2)
    assert main(["serve", "--model", "a.gguf,n_parallel=0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokenwire serve: models.0.n_parallel: ") and \
        len(err.splitlines()) == 1, err
    assert main(["serve", "--model", "nothing-1m", "--port", "1"]) == 1
    err = capsys.readouterr().err
    assert err == "tokenwire serve: not starting: model 'nothing-1m' is neither a file nor a " \
        "shipped model (smollm2-135m, gemma3-270m, smollm2-think)\n", err


def test_the_parser_settings_name_every_parser_there_is() -> None:
    """`--reasoning-parser` and `--tool-call-parser` take exactly the parsers serving has (vLLM's
    names), and `auto`; the reasoning one `none` too."""
    from typing import get_args

    from tokenwire.config import Settings
    from tokenwire.serving.reasoning import PARSERS as REASONING
    from tokenwire.serving.toolcalls import PARSERS as TOOLS

    def choices(name: str) -> set[str]:
        return set(get_args(Settings.model_fields[name].annotation))

    assert choices("tool_call_parser") == {"auto", *TOOLS}
    assert choices("reasoning_parser") == {"auto", "none", *REASONING}


def test_a_per_model_parser_that_does_not_exist_is_refused_by_name() -> None:
    import pydantic

    from tokenwire.config import ModelSpec

    with pytest.raises(pydantic.ValidationError) as exc:
        ModelSpec.parse("smollm2-135m,tool_call_parser=hemes")
    assert exc.value.errors()[0]["loc"] == ("tool_call_parser",)


def test_the_thinking_model_is_served_under_its_short_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its file is `model.gguf` in a folder named by its build: an id of `model` would not
    say which model it is."""
    monkeypatch.setenv("TOKENWIRE_THINK_MODEL", "/cache/smollm2-think-d1486c8c3ffa/model.gguf")
    (think,) = Settings(models=["smollm2-think"]).model_settings()
    assert think.served_model_name == "smollm2-think"
    assert think.model == Path("/cache/smollm2-think-d1486c8c3ffa/model.gguf")

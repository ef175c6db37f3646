"""deploy/: the compose file against the Compose Specification's schema, the Kubernetes
manifests against Kubernetes' own schemas (strict: unknown fields are errors), and every
tokenwire command line and setting in them against tokenwire's own CLI and settings."""

from __future__ import annotations

import importlib.resources
import json
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tokenwire.cli import _parser
from tokenwire.config import Settings

DEPLOY = Path(__file__).parents[1] / "deploy"
KUBERNETES = "1.30.0"
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))

#: `vllm serve` flags the files use, as vLLM 0.34's own CLI defines them (docs/engines.md)
VLLM_FLAGS = {"--model", "--served-model-name", "--max-model-len", "--enable-scale-out",
              "--enable-prefix-caching", "--tensor-parallel-size", "--data-parallel-size",
              "--pipeline-parallel-size", "--distributed-executor-backend", "--api-key",
              "--generation-config"}
#: `python -m sglang.launch_server` flags, as SGLang 0.5.23's server_args.py defines them
SGLANG_FLAGS = {"--model-path", "--served-model-name", "--context-length", "--host", "--port",
                "--tp-size", "--dp-size", "--api-key", "--enable-deterministic-inference",
                "--incremental-streaming-output"}


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())  # type: ignore[no-any-return]


def k8s_docs() -> list[dict[str, Any]]:
    return [d for p in MANIFESTS for d in yaml.safe_load_all(p.read_text()) if d]


def flags(args: list[str]) -> set[str]:
    return {a for a in args if a.startswith("--")}


def tokenwire_settings(args: list[str], env: dict[str, str],
                       monkeypatch: pytest.MonkeyPatch) -> Settings:
    """What `tokenwire serve ARGS` with ENV would run with (the CLI's own parsing)."""
    parsed = _parser().parse_args(["serve", *args])
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    overrides = {k: v for k, v in {"engine": parsed.engine, "upstream": parsed.upstream,
                                   "tokenizer": parsed.tokenizer, "port": parsed.port,
                                   "host": parsed.host}.items() if v is not None}
    return Settings(**overrides)


def test_compose_file_follows_the_compose_spec() -> None:
    schema_file = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / \
        "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = [e.message for e in validator.iter_errors(compose())]
    assert errors == []
    broken = compose()
    broken["services"]["gateway"]["imagee"] = "typo"
    assert list(validator.iter_errors(broken)), "the schema check must catch an unknown key"


@pytest.mark.parametrize("doc", k8s_docs(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_kubernetes_manifests_are_valid(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_kubernetes_check_catches_mistakes() -> None:
    deployment = next(d for d in k8s_docs() if d["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["port"] = 8080  # not a field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def test_the_gateways_command_lines_are_tokenwires(monkeypatch: pytest.MonkeyPatch) -> None:
    services = compose()["services"]
    for name in ("gateway", "gateway-sglang"):
        s = tokenwire_settings(services[name]["command"], {}, monkeypatch)
        assert s.engine in ("vllm", "sglang") and s.upstream and s.tokenizer is not None
    deployment = next(d for d in k8s_docs() if d["kind"] == "Deployment")
    config = next(d for d in k8s_docs() if d["kind"] == "ConfigMap")["data"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    secrets = {e["name"]: "k1,k2" for e in container["env"]}
    s = tokenwire_settings([], {**config, **secrets}, monkeypatch)
    assert s.upstream == ["http://vllm-0.vllm:8000", "http://vllm-1.vllm:8000"]
    assert s.api_keys == ["k1", "k2"] and s.port == int(config["TOKENWIRE_PORT"])


def test_the_engines_flags_exist() -> None:
    services = compose()["services"]
    assert flags(services["vllm"]["command"]) <= VLLM_FLAGS
    assert flags(services["sglang"]["command"]) <= SGLANG_FLAGS
    vllm = next(d for d in k8s_docs() if d["kind"] == "StatefulSet")
    assert flags(vllm["spec"]["template"]["spec"]["containers"][0]["args"]) <= VLLM_FLAGS
    # the generate endpoint needs --enable-scale-out on vLLM 0.30+ (else 403 or 404)
    assert "--enable-scale-out" in services["vllm"]["command"]


def test_deploy_docs_show_real_flags() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "deploy.md").read_text()
    lines = [line for line in doc.splitlines()
             if line.startswith(("vllm serve ", "python -m sglang.launch_server",
                                 "tokenwire serve "))]
    assert len(lines) >= 8
    parser = _parser()
    for line in lines:
        words = shlex.split(line, comments=True)
        if words[0] == "tokenwire":
            parser.parse_args(words[1:])  # exits on a flag tokenwire does not have
        else:
            known = VLLM_FLAGS if words[0] == "vllm" else SGLANG_FLAGS
            assert flags(words) <= known, line


def test_the_settings_table_lists_every_setting() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "deploy.md").read_text()
    table = doc[doc.index("## Settings\n"):]
    listed = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}
    assert listed == set(Settings.model_fields)

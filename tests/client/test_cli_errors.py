"""The CLI's remote commands on user errors (a server that is down, a base URL without /v1, a
wrong key, an unknown model): one line on stderr naming the flag to fix, a non-zero exit, no
traceback. Real subprocess runs of `python -m tokenwire`, against a closed loopback port and a
real uvicorn server (on the scripted engine)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import _free_port, start_server

REMOTE = [["tokenize", "hi"], ["detokenize", "1", "2"], ["chat"]]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokenwire", *args], input="hi\n",
                          capture_output=True, text=True, timeout=120)


def one_line(done: subprocess.CompletedProcess[str], *wanted: str, rc: int = 1) -> str:
    err = done.stderr.strip()
    assert done.returncode == rc, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and len(err.splitlines()) == 1, done.stderr
    for w in wanted:
        assert w in err, (w, err)
    return err


@pytest.fixture
def server(make_app) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A real server on loopback that wants the key `k`; its root URL (no /v1)."""
    port = _free_port()
    srv, thread = start_server(make_app(api_keys=["k"]), port)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=30)


@pytest.mark.parametrize("cmd", REMOTE, ids=lambda c: c[0])
def test_a_closed_port_is_one_line(cmd: list[str]) -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"
    err = one_line(run(*cmd, "--server", url), f"cannot reach {url}", "connection refused",
                   "tokenwire serve", "--server")
    assert err.startswith(f"tokenwire {cmd[0]}: ")


def test_a_url_without_a_scheme_is_one_line() -> None:
    one_line(run("tokenize", "hi", "--server", "127.0.0.1:9/v1"), "not an http", "--server")


@pytest.mark.parametrize("cmd", REMOTE, ids=lambda c: c[0])
def test_a_base_url_without_v1_names_the_fix(server: str, cmd: list[str]) -> None:
    one_line(run(*cmd, "--server", server, "--api-key", "k"), "has no tokenwire API",
             f"--server {server}/v1")
    assert run(*cmd[:2], "--server", f"{server}/v1", "--api-key", "k").returncode == 0


@pytest.mark.parametrize("cmd", REMOTE, ids=lambda c: c[0])
def test_a_missing_or_wrong_key_names_api_key(server: str, cmd: list[str]) -> None:
    one_line(run(*cmd, "--server", f"{server}/v1"), "needs an API key", "--api-key")
    one_line(run(*cmd, "--server", f"{server}/v1", "--api-key", "bad"), "refused the API key",
             "--api-key")


def test_unknown_model_and_version_name_their_flags(server: str) -> None:
    base = ["--server", f"{server}/v1", "--api-key", "k"]
    one_line(run("tokenize", "hi", *base, "--model", "nope"), "'nope'", "(--model)")
    one_line(run("chat", *base, "--model", "nope"), "'nope'", "(--model)")
    one_line(run("detokenize", "1", *base, "--tokenizer-version", "x@sha256:0000000000000000"),
             "not registered", "(--tokenizer-version)")


def test_bad_arguments_are_one_line(tmp_path: Path) -> None:
    one_line(run("detokenize", "1", "x", "--server", "http://127.0.0.1:9/v1"),
             "ids must be integers", rc=2)
    one_line(run("tokenize", "hi", "--artifact", str(tmp_path / "none.json")),
             "cannot read --artifact", rc=2)
    (tmp_path / "bad.json").write_text("not json")
    one_line(run("detokenize", "1", "--artifact", str(tmp_path / "bad.json")),
             "is not a tokenizer.json", rc=2)

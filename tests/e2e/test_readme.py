"""The README's Python examples run as written against a real server (docs cannot drift)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import LiveServer

pytestmark = pytest.mark.engine

README = Path(__file__).parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_examples() -> None:
    assert BLOCKS


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(live_server: LiveServer, code: str, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENWIRE_CLIENT_CACHE", str(tmp_path))  # not the user's cache
    code = code.replace("http://127.0.0.1:8000", live_server.url)
    exec(compile(code, str(README), "exec"), {})

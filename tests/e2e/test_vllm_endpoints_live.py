"""On the live server (the real model, loaded as `tokenwire serve` loads it): vLLM's card
`root`, /tokenizer_info, and the CLI's one-line error for a base URL without /v1."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.conftest import TEST_UPSTREAM, LiveServer

pytestmark = pytest.mark.engine


def test_card_root_and_tokenizer_info(live_server: LiveServer) -> None:
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        card = http.get("/v1/models").json()["data"][0]
        info = http.get("/tokenizer_info").json()
        art = http.get(info["artifact_url"])
    if not TEST_UPSTREAM:  # the embedded engine: the GGUF's own name for the model
        assert card["root"] == "SmolLM2-135M-Instruct"
    else:  # a gateway: the upstream's own name for the model
        assert card["root"]
    assert card["parent"] is None
    assert info["tokenizer_version"] == card["tokenizer_version"]
    assert art.status_code == 200 and art.headers["X-Tokenwire-Sha256"] == info["sha256"]


def test_cli_without_v1_is_one_line(live_server: LiveServer) -> None:
    done = subprocess.run([sys.executable, "-m", "tokenwire", "tokenize", "hi", "--server",
                           live_server.url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"tokenwire tokenize: {live_server.url} has no tokenwire "
                                   f"API (the base URL ends in /v1: --server "
                                   f"{live_server.url}/v1)")

"""The proposal's loop on `tokenwire serve` as `make serve` starts it (the embedded model, no
content policy): ids in and out convert nothing; the same loop with text at both ends costs
exactly its edges. And docs/examples/retrieval_loop.py, the worked example, run against it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, plain_live_server
from tests.e2e.test_storage_loop import PASSAGES, QUESTION, conversions, delta, id_loop, text_loop
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = [pytest.mark.engine, pytest.mark.slow]

EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "retrieval_loop.py"


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """`tokenwire serve` as `make serve` starts it (the embedded model, no content policy),
    in a thread, with a store of its own."""
    with plain_live_server(tmp_path_factory.mktemp("plain")) as server:
        yield server


def test_the_id_loop_converts_nothing_and_the_text_loop_only_its_edges(
        plain_server: LiveServer, tok: HFTokenizer) -> None:
    passages = [tok.encode(p) for p in PASSAGES]  # what the client holds: ids, from anywhere
    question = tok.encode(QUESTION)
    with httpx.Client(base_url=plain_server.url, timeout=120) as c:
        # once first: the template's structure pieces are encoded once per process, then
        # remembered (and the engine's prefix cache warms, which changes no count)
        first = conversions(plain_server)
        id_loop(c, tok, passages, question)
        warm = delta(first, conversions(plain_server))
        assert {reason for (_, _, reason) in warm} <= {"template"}, warm
        before = conversions(plain_server)
        sampled = id_loop(c, tok, passages, question)
        assert delta(before, conversions(plain_server)) == {}
        before = conversions(plain_server)
        text = text_loop(c, passages[0])
        moved = delta(before, conversions(plain_server))
    # the ids the model sampled are the ids the text loop's answer is made of
    assert text == tok.decode(sampled)
    assert moved == {("gateway", "encode", "document"): len(PASSAGES),
                     ("gateway", "encode", "search"): 1,
                     ("gateway", "encode", "prompt"): 1,
                     ("gateway", "decode", "output"): 1}, moved




def test_the_worked_example_runs_and_its_id_loop_converts_nothing(
        plain_server: LiveServer) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLE), "--base-url", plain_server.url,
                          "--rounds", "1", "--json"], capture_output=True, text=True,
                         timeout=600, check=True)
    runs = json.loads(out.stdout)
    assert runs["ids"]["conversions"] == {}
    assert sum(runs["text"]["conversions"].values()) > 0
    assert runs["ids"]["answer"].strip()  # decoded once, for the human
    for r in runs.values():
        assert r["sent"] > 0 and r["received"] > 0 and r["seconds"] > 0

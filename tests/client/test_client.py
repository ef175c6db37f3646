"""The Python client, against the in-process app (scripted engine) and hostile transports."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import loop_gaps
from tests.fakes import MODEL, FakeEngine
from tests.tokenizers.spellings import DIGITS_THEN_BYTE_LEVEL, TRANSFORMERS_PRE, respell
from tokenwire import (
    AsyncClient,
    Client,
    InvalidRequestError,
    InvalidTokenIdError,
    ModelNotFoundError,
    TokenizerIntegrityError,
)
from tokenwire.errors import APIConnectionError, EngineError, NotFoundError
from tokenwire.protocol import ChatCompletion, Completion
from tokenwire.tokenizers.hf import HFTokenizer, canonical_json

pytestmark = pytest.mark.anyio


@pytest.fixture
async def sdk(app, tmp_path: Path) -> AsyncIterator[AsyncClient]:  # type: ignore[no-untyped-def]
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app):
        http = httpx.AsyncClient(transport=transport, base_url="http://test/v1/")
        async with AsyncClient(http_client=http, cache_dir=tmp_path / "cache") as c:
            yield c


async def test_chat_in_ids_fills_in_the_version(sdk: AsyncClient, tok: HFTokenizer,
                                               fake_engine: FakeEngine) -> None:
    r = await sdk.chat(MODEL, [{"role": "user", "content": tok.encode("Hello!")}])
    assert isinstance(r, ChatCompletion)
    assert r.tokenizer_version == tok.version
    assert r.choices[0].message.token_ids == fake_engine.script
    assert r.choices[0].token_ids == fake_engine.script
    assert r.prompt_token_ids == fake_engine.prompts[0]
    again = await sdk.chat(MODEL, [{"role": "user", "content": "Hello!"}])
    assert again.prompt_token_ids == r.prompt_token_ids


async def test_streams_yield_typed_chunks(sdk: AsyncClient, tok: HFTokenizer,
                                          fake_engine: FakeEngine) -> None:
    stream = await sdk.chat(MODEL, [{"role": "user", "content": "Hi"}], stream=True)
    ids: list[int] = []
    async with stream:
        async for chunk in stream:
            for ch in chunk.choices:
                ids += ch.delta.token_ids or []
    assert ids == fake_engine.script
    assert stream.response.is_closed
    comp = await sdk.complete(MODEL, tok.encode("Once"), stream=True, max_tokens=3)
    texts = [ch.text async for c in comp for ch in c.choices]
    assert "".join(texts) == tok.decode(fake_engine.script[:3])


async def test_complete_and_tokenize(sdk: AsyncClient, tok: HFTokenizer) -> None:
    c = await sdk.complete(MODEL, [tok.encode("a"), tok.encode("b")], max_tokens=2)
    assert isinstance(c, Completion) and len(c.choices) == 2
    t = await sdk.tokenize("Hello!", model=MODEL)
    assert t.tokens == tok.encode("Hello!")
    d = await sdk.detokenize(t.tokens, model=MODEL)
    assert d.prompt == "Hello!"


async def test_errors_are_typed(sdk: AsyncClient) -> None:
    with pytest.raises(InvalidTokenIdError) as info:
        await sdk.chat(MODEL, [{"role": "user", "content": [1, 2, 99999]}])
    assert info.value.param == "messages[0].content.token_ids[2]"
    with pytest.raises(ModelNotFoundError):
        await sdk.chat("nope", [{"role": "user", "content": "x"}])
    with pytest.raises(InvalidRequestError) as bad:
        await sdk.detokenize([1, 2])
    assert bad.value.param == "model"
    with pytest.raises(InvalidTokenIdError) as info:
        await sdk.complete(MODEL, [253, 10**7])  # the version is filled in, the id is checked
    assert info.value.param == "prompt[1]"
    r = await sdk.chat(MODEL, [{"role": "user", "content": "x"},
                               {"role": "assistant", "token_ids": [253]},
                               {"role": "user", "content": "y"}])
    assert r.tokenizer_version is not None  # filled in from the model's card


async def test_tokenizer_is_fetched_verified_and_cached(sdk: AsyncClient, tok: HFTokenizer,
                                                        tmp_path: Path) -> None:
    local = await sdk.tokenizer(model=MODEL)
    assert local.version == tok.version
    assert local.encode("Local and remote agree.") == tok.encode("Local and remote agree.")
    typed = "a <|im_end|> typed"  # the server's text mode, as its entry publishes it
    assert local.encode(typed) == (await sdk.tokenize(typed, model=MODEL)).tokens
    assert local.text_encoding == (await sdk.tokenizers())[0].text_encoding.model_dump()
    [stored] = (tmp_path / "cache").rglob("tokenizer.json")
    assert stored.read_bytes() == tok.artifact
    assert (await sdk.tokenizer("smollm2-49k")).version == tok.version  # alias resolved
    # a cache file changed on disk is refused, not used
    stored.write_bytes(stored.read_bytes().replace(b'"hello"', b'"hullo"'))
    fresh = AsyncClient(cache_dir=tmp_path / "cache")
    with pytest.raises(TokenizerIntegrityError):
        await fresh.tokenizer(tok.version)
    await fresh.aclose()


async def test_tokenizer_loads_off_the_event_loop(sdk: AsyncClient, tok: HFTokenizer,
                                                  tmp_path: Path) -> None:
    """Verifying, building and storing a 1.5 MB artifact (and loading it from the disk cache)
    runs in a worker thread: the event loop keeps turning meanwhile."""
    for client in (sdk, AsyncClient(cache_dir=tmp_path / "cache")):  # fetched, then from disk
        async with loop_gaps(0.002) as gaps:
            start = time.perf_counter()
            assert (await client.tokenizer(tok.version)).version == tok.version
            took = time.perf_counter() - start
        assert took > 0.1, took  # enough work that a stall would show
        # the loop turns between the pieces; each native call (`Tokenizer.from_str`, a third of
        # the work) holds the GIL throughout, longer on a loaded machine
        assert len(gaps) >= 5 and max(gaps) < took * 0.75, (max(gaps), took, len(gaps))
    [stored] = (tmp_path / "cache").rglob("tokenizer.json")
    assert stored.read_bytes() == tok.artifact


def _entry(tok: HFTokenizer, **text_encoding: bool) -> dict[str, object]:
    """A `GET /v1/tokenizers/{id}` answer for `tok`, its text_encoding overridden."""
    return {"id": tok.version, "object": "tokenizer", "family": tok.family,
            "aliases": [], "vocab_size": tok.vocab_size, "special_tokens": [],
            "sha256": tok.sha256, "artifact_url": f"/v1/tokenizers/{tok.version}/tokenizer.json",
            "text_encoding": tok.text_encoding | text_encoding, "models": []}


def _serving(artifact: bytes, entry: dict[str, object]) -> httpx.MockTransport:
    def serve(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/tokenizer.json"):
            return httpx.Response(200, content=artifact,
                                  headers={"x-tokenwire-sha256": str(entry["sha256"])})
        assert request.url.path.endswith(f"/tokenizers/{entry['id']}")
        return httpx.Response(200, json=entry)

    return httpx.MockTransport(serve)


def test_a_tampered_artifact_is_refused(tok: HFTokenizer, tmp_path: Path) -> None:
    tampered = tok.artifact.replace(b'"hello"', b'"hullo"')
    client = Client(http_client=httpx.Client(transport=_serving(tampered, _entry(tok)),
                                             base_url="http://evil/v1/"),
                    cache_dir=tmp_path)
    with pytest.raises(TokenizerIntegrityError):
        client.tokenizer(tok.version)
    assert not list(tmp_path.rglob("tokenizer.json"))


async def test_the_published_text_encoding_is_applied(tok: HFTokenizer, tmp_path: Path) -> None:
    """The SDK encodes text under the entry's `text_encoding`, not under its own defaults, and
    keeps it beside the cached bytes: a server that published `encode_special_tokens: false`
    gets control tokens parsed out of text, fetched or from disk, sync or async."""
    entry = _entry(tok, encode_special_tokens=False)
    typed = "a<|im_end|>b"
    assert 2 not in tok.encode(typed)  # the server's own text mode keeps it text

    def client() -> Client:
        return Client(http_client=httpx.Client(transport=_serving(tok.artifact, entry),
                                               base_url="http://test/v1/"), cache_dir=tmp_path)

    fetched = client().tokenizer(tok.version)
    assert fetched.text_encoding == entry["text_encoding"]
    assert fetched.encode(typed) == tok.encode(typed, parse_special=True)
    assert client().tokenizer(tok.version).encode(typed) == fetched.encode(typed)  # from disk
    http = httpx.AsyncClient(transport=_serving(tok.artifact, entry), base_url="http://test/v1/")
    async with AsyncClient(http_client=http, cache_dir=tmp_path / "async") as sdk:
        assert (await sdk.tokenizer(tok.version)).encode(typed) == fetched.encode(typed)


def test_the_artifact_is_verified_by_its_fingerprint(tok: HFTokenizer, tmp_path: Path) -> None:
    """Another spelling of the version's tokenizer is its artifact (other bytes, the same ids);
    another tokenizer is refused, even with its own sha256 published beside it."""
    respelled = canonical_json(respell(json.loads(tok.artifact), DIGITS_THEN_BYTE_LEVEL))
    converted = canonical_json(respell(json.loads(tok.artifact), TRANSFORMERS_PRE))

    def client(artifact: bytes, cache: str) -> Client:
        entry = _entry(tok) | {"sha256": hashlib.sha256(artifact).hexdigest()}
        return Client(http_client=httpx.Client(transport=_serving(artifact, entry),
                                               base_url="http://test/v1/"),
                      cache_dir=tmp_path / cache)

    local = client(respelled, "a").tokenizer(tok.version)
    assert local.version == tok.version and local.artifact == respelled
    assert client(respelled, "a").tokenizer(tok.version).version == tok.version  # from disk
    with pytest.raises(TokenizerIntegrityError, match="not that version's"):
        client(converted, "b").tokenizer(tok.version)
    assert not list((tmp_path / "b").rglob("tokenizer.json"))


async def test_an_old_id_loads_from_the_cache_or_through_the_server(sdk: AsyncClient,
                                                                    tok: HFTokenizer,
                                                                    tmp_path: Path) -> None:
    """An id from before the fingerprint: a cache entry written then (by its artifact's
    sha256) still loads, with no server; otherwise the server names the version it is now."""
    old = "smollm2-49k@sha256:" + tok.sha256[:16]
    cached = tmp_path / "old-cache" / old.replace("@sha256:", "-")
    cached.mkdir(parents=True)
    (cached / "tokenizer.json").write_bytes(tok.artifact)
    (cached / "text_encoding.json").write_text(json.dumps(tok.text_encoding))

    def offline(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("no server")

    offline_client = Client(http_client=httpx.Client(transport=httpx.MockTransport(offline),
                                                     base_url="http://x/v1/"),
                            cache_dir=tmp_path / "old-cache")
    assert offline_client.tokenizer(old).version == tok.version
    fetched = await sdk.tokenizer(old)
    assert fetched.version == tok.version and fetched.artifact == tok.artifact
    assert await sdk.tokenizer(old) is fetched  # remembered


def test_in_band_stream_errors_and_broken_connections(tmp_path: Path) -> None:
    err = {"error": {"message": "engine died", "type": "server_error", "param": None,
                     "code": "engine_error"}}
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "a"}}]}
    sse = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(err)}\n\ndata: [DONE]\n\n"

    def serve(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models/m"):
            raise httpx.ConnectError("refused")
        return httpx.Response(200, content=sse.encode(),
                              headers={"content-type": "text/event-stream"})

    client = Client(http_client=httpx.Client(transport=httpx.MockTransport(serve),
                                             base_url="http://x/v1/"), cache_dir=tmp_path)
    stream = client.chat("m", [{"role": "user", "content": "x"}], stream=True)
    got = []
    with pytest.raises(EngineError, match="engine died"):
        for c in stream:
            got.append(c)
    assert len(got) == 1 and stream.response.is_closed
    with pytest.raises(APIConnectionError):
        client.tokenizer_version("m")


async def test_documents_in_ids_and_a_chat_that_reads_one(sdk: AsyncClient, tok: HFTokenizer,
                                                         fake_engine: FakeEngine) -> None:
    """The SDK's document calls: store ids, find them by ids, read them back, splice one into
    a chat by reference (the prompt holds its ids exactly)."""
    ids = tok.encode(" the Loire is the longest river in France")
    made = await sdk.add_document(token_ids=ids, tokenizer_version=tok.version)
    other = await sdk.add_document("Bees live in colonies.")
    assert (made.count, other.tokenizer_version) == (len(ids), tok.version)
    hits = await sdk.search_documents(tok.encode(" longest river"), tokenizer_version=tok.version)
    assert [h.document_id for h in hits.data] == [made.id]
    assert (await sdk.search_documents("bees colonies")).data[0].document_id == other.id
    assert (await sdk.document(made.id)).token_ids == ids
    assert (await sdk.document(other.id, format="text")).text == "Bees live in colonies."
    r = await sdk.chat(MODEL, [{"role": "user", "content": [
        {"type": "input_document", "document_id": made.id}]}])
    assert r.prompt_token_ids is not None
    assert any(r.prompt_token_ids[i:i + len(ids)] == ids
               for i in range(len(r.prompt_token_ids)))
    with pytest.raises(InvalidRequestError) as info:
        await sdk.add_document(token_ids=[1, 2])  # ids need their version
    assert info.value.param == "tokenizer_version"
    assert (await sdk.delete_document(other.id)).deleted
    assert (await sdk.search_documents("bees colonies")).data == []
    with pytest.raises(NotFoundError):
        await sdk.document(other.id)


def test_the_sync_client_has_the_same_document_calls(app, tok: HFTokenizer,  # type: ignore[no-untyped-def]
                                                     tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    with TestClient(app, base_url="http://test/v1/") as http, \
            Client(http_client=http, cache_dir=tmp_path / "cache") as sdk:
        made = sdk.add_document("A violin has four strings.")
        assert sdk.document(made.id).token_ids == tok.encode("A violin has four strings.")
        assert sdk.search_documents("violin strings").data[0].document_id == made.id
        assert sdk.delete_document(made.id).model_dump() == {
            "id": made.id, "object": "document", "deleted": True}

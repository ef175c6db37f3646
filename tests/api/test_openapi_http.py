"""GET /openapi.json and GET /docs: the document is the wire models', covers every route, and
the page loads only what the server itself serves. (tests/e2e/test_schema.py checks real
answers against the document.)"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from typing import Any

import httpx
import jsonschema
import pytest
from starlette.responses import Response
from starlette.routing import Route

from tests.conftest import serve_in_process
from tests.fakes import MODEL
from tokenwire.api.openapi import ENDPOINTS, NOT_DOCUMENTED, build_document
from tokenwire.protocol import ChatCompletion, ChatCompletionRequest, ModelCard
from tokenwire.protocol.generate import GenerateRequest

pytestmark = pytest.mark.anyio

REF = "#/components/schemas/"
TGI_PATHS = ("/", "/generate", "/generate_stream")


@pytest.fixture
async def document(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.get("/openapi.json")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    return r.json()  # type: ignore[no-any-return]


def _schema(document: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    return document["components"]["schemas"][ref["$ref"].removeprefix(REF)]  # type: ignore[no-any-return]


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


async def test_every_route_is_documented_or_excluded_with_a_reason(
        app, document: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    assert document["openapi"] == "3.1.0"
    documented = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    for route in app.routes:
        if route.path in NOT_DOCUMENTED:
            assert NOT_DOCUMENTED[route.path]
            continue
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        assert {(m, path) for m in route.methods - {"HEAD"}} <= documented, route.path
    assert len(documented) == len(ENDPOINTS)
    # every reference resolves
    names = set(document["components"]["schemas"])
    assert {r.removeprefix(REF) for r in _refs(document)} <= names


def test_a_route_missing_from_the_table_is_an_error(app) -> None:  # type: ignore[no-untyped-def]
    async def new(request: object) -> Response:
        return Response()

    with pytest.raises(LookupError, match="POST /v1/new is neither in ENDPOINTS"):
        build_document([*app.routes, Route("/v1/new", new, methods=["POST"])])
    with pytest.raises(LookupError, match="ENDPOINTS names routes the app does not have"):
        build_document([r for r in app.routes if r.path != "/v1/completions"])


async def test_bodies_are_the_models_the_routes_use(document: dict[str, Any]) -> None:
    """The request schema is the model's: every field, no other (unknown fields are 400s);
    a response requires what its serializer always writes and nothing it leaves out."""
    chat = document["paths"]["/v1/chat/completions"]["post"]
    request = _schema(document, chat["requestBody"]["content"]["application/json"]["schema"])
    assert set(request["properties"]) == set(ChatCompletionRequest.model_fields)
    assert request["additionalProperties"] is False
    assert set(request["required"]) == {"model", "messages"}
    ok = chat["responses"]["200"]["content"]
    whole = _schema(document, ok["application/json"]["schema"])
    assert set(whole["properties"]) == set(ChatCompletion.model_fields)
    assert {"id", "object", "created", "model", "choices"} <= set(whole["required"])
    assert not set(whole["required"]) & ChatCompletion.omit_if_none
    stream = ok["text/event-stream"]["schema"]["properties"]["data"]["anyOf"][0]
    assert stream["contentSchema"]["anyOf"] == [{"$ref": REF + "ChatCompletionChunk"},
                                                {"$ref": REF + "ErrorResponse"}]
    card = _schema(document, document["paths"]["/v1/models/{model}"]["get"]["responses"]["200"]
                   ["content"]["application/json"]["schema"])
    assert set(card["required"]) == set(ModelCard.model_fields)  # template_version: null, sent


async def test_token_native_fields_are_described_by_their_docstrings(
        document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    props = schemas["ChatCompletionRequest"]["properties"]
    assert props["tokenizer_version"]["description"] == (
        "The tokenizer version the request's ids belong to; required when it sends ids.")
    assert "token_ids" in props["response_format_tokens"]["description"]
    assert "sampled" in schemas["ChatCompletion"]["properties"]["token_ids_source"]["description"]
    assert schemas["InputTokensBlock"]["description"].startswith("Token ids spliced")
    # a field tokenwire refuses unless neutral accepts exactly its neutral values
    assert props["priority"]["enum"] == [0]
    assert props["functions"]["enum"] == [None, []]
    sampling = schemas["GenerateSamplingParams"]["properties"]
    assert sampling["bad_words"]["enum"] == [None, []]
    assert schemas["GenerateRequest"]["properties"]["output_mode"]["enum"] == ["tokens"]
    assert GenerateRequest.unsupported["output_mode"] == ("tokens",)


async def test_errors_are_error_responses(document: dict[str, Any]) -> None:
    """OpenAI's error body everywhere, but Anthropic's on its Messages API and TGI's on its
    routes."""
    for path, ops in document["paths"].items():
        error = {"$ref": REF + ("AnthropicErrorBody" if path.startswith("/v1/messages")
                                else "TGIErrorResponse" if path in TGI_PATHS
                                else "ErrorResponse")}
        for method, op in ops.items():
            codes = {int(c) for c in op["responses"]}
            probe = path in ("/health", "/ping")
            assert (401 in codes) == (not probe), (method, path)
            assert (413 in codes) == ("requestBody" in op), (method, path)
            for code, response in op["responses"].items():
                if int(code) >= 400 and not probe:
                    assert response["content"]["application/json"]["schema"] == error
    assert {400, 404, 429, 503} <= {int(c) for c in
                                    document["paths"]["/v1/completions"]["post"]["responses"]}


async def test_answers_match_the_document(client: httpx.AsyncClient,
                                          document: dict[str, Any]) -> None:
    """The examples work as documented, and a stream's events match its event schema (the
    live-server run covers this broadly; this one is fast)."""
    root = {"components": document["components"]}

    def check(ref: dict[str, Any], body: Any) -> None:
        jsonschema.Draft202012Validator({**ref, **root}).validate(body)

    op = document["paths"]["/v1/chat/completions"]["post"]
    examples = op["requestBody"]["content"]["application/json"]["examples"]
    assert examples["stream"]["value"] == {**examples["whole"]["value"], "stream": True}
    example = {**examples["whole"]["value"], "model": MODEL}
    content = op["responses"]["200"]["content"]
    r = await client.post("/v1/chat/completions", json=example)
    assert r.status_code == 200
    check(content["application/json"]["schema"], r.json())
    r = await client.post("/v1/chat/completions", json={**example, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    event = content["text/event-stream"]["schema"]
    json_event, done = event["properties"]["data"]["anyOf"]
    events = [f.removeprefix("data: ") for f in r.text.split("\n\n") if f]
    assert len(events) > 2
    check(event, {"data": events[-1]})
    check(done, events[-1])
    for data in events[:-1]:
        check(event, {"data": data})
        check(json_event["contentSchema"], json.loads(data))  # jsonschema does not read it
    with pytest.raises(jsonschema.ValidationError):
        check(json_event["contentSchema"], {"id": "x"})
    r = await client.post("/v1/chat/completions", json={**example, "n": 0})
    assert r.status_code == 400
    check(op["responses"]["400"]["content"]["application/json"]["schema"], r.json())


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.links += [v for k, v in attrs if k in ("src", "href") and v]


async def test_docs_loads_only_what_the_server_serves(client: httpx.AsyncClient) -> None:
    r = await client.get("/docs")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    parser = _Links()
    parser.feed(r.text)
    assert len(parser.links) >= 2
    assert not re.search(r"(https?:)?//", r.text), "the page names an outside address"
    assert "validatorUrl: null" in r.text  # Swagger UI would post the document to its validator
    assert 'url: "openapi.json"' in r.text
    kinds = {}
    for link in parser.links:
        url = httpx.URL("http://test/docs").join(link)
        asset = await client.get(url.path)
        assert asset.status_code == 200, link
        assert asset.content, link
        kinds[url.path.rsplit(".", 1)[-1]] = asset.headers["content-type"]
    assert kinds["css"].startswith("text/css")
    assert kinds["js"].startswith("text/javascript")
    assert kinds["png"] == "image/png"
    r = await client.get("/docs/assets/swagger-editor-bundle.js")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"
    r = await client.get("/docs/assets/..%2F..%2Fcore.py")
    assert r.status_code == 404


async def test_the_document_and_docs_need_no_key(make_app) -> None:  # type: ignore[no-untyped-def]
    async with serve_in_process(make_app(api_keys=["sk-test"])) as c:
        for path in ("/openapi.json", "/docs", "/docs/assets/swagger-ui.css"):
            assert (await c.get(path)).status_code == 200, path
        assert (await c.get("/v1/models")).status_code == 401
        # the open prefix opens nothing else: the router does not resolve dot segments
        r = await c.get("/docs/assets/%2E%2E/%2E%2E/v1/models")
        assert r.status_code == 404
        assert "data" not in r.json()

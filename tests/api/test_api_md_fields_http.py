"""docs/api.md and its pages (docs/api/*.md) are a reference, not a second source of truth:
every request field their tables name exists in the request body schema `GET /openapi.json`
serves for that route (the one built from the models the server parses requests with,
api/openapi.py).

A field table is one whose first column is headed `field`. Its route is the `## METHOD /path`
section it stands in (the staleness bounds' table: every generation route), and the table of
every OpenAI and vLLM field names chat and completions in columns of their own (a field whose
cell is empty there is not that route's; `name` (chat) or `name` (completions) is one route's
only). In a row's first cell, each `name` outside parentheses is a field: `a.b` a member of
`a`, `a[]` an item of the array `a`; what stands in parentheses is a value or a note.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import serve_in_process

pytestmark = pytest.mark.anyio

DOCS = Path(__file__).parents[2] / "docs"
API = [DOCS / "api.md", *sorted((DOCS / "api").glob("*.md"))]
"""The reference: the index and one page per API family and the control plane."""

CHAT, COMPLETIONS = ("post", "/v1/chat/completions"), ("post", "/v1/completions")
GENERATION = [CHAT, COMPLETIONS, ("post", "/inference/v1/generate"), ("post", "/v1/responses"),
              ("post", "/v1/messages")]
SECTIONS = {"Staleness bounds: which weights may serve a request": GENERATION}
"""Field tables under a heading that names no route: the routes they are for."""
COLUMNS = {"chat": CHAT, "completions": COMPLETIONS}
NAME = re.compile(r"[a-z_][a-z0-9_]*(?:\[\])?(?:\.[a-z_][a-z0-9_]*(?:\[\])?)*")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def field_tables(text: str) -> Iterator[tuple[str, str, list[list[str]]]]:
    """(its `##` heading, its `###` heading, header and rows) of each table whose first column
    is `field`; fenced code is not read."""
    h2 = h3 = ""
    lines = text.split("\n")
    fenced = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            h2, h3 = line[3:], ""
        elif not fenced and line.startswith("### "):
            h3 = line[4:]
        elif not fenced and line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(_cells(lines[i]))
                i += 1
            if block[0][0] == "field":
                yield h2, h3, [block[0], *block[2:]]
            continue
        i += 1


def names(cell: str) -> list[tuple[str, str | None]]:
    """Each backticked name outside parentheses, with the route it is qualified by (`x`
    (chat)), if any."""
    out: list[tuple[str, str | None]] = []
    depth = i = 0
    while i < len(cell):
        if cell[i] == "`":
            end = cell.index("`", i + 1)
            if depth == 0:
                qualifier = re.match(r"\s*\((chat|completions)\)", cell[end + 1:])
                out.append((cell[i + 1:end], qualifier.group(1) if qualifier else None))
            i = end + 1
            continue
        depth += {"(": 1, ")": -1}.get(cell[i], 0)
        i += 1
    return out


def listed() -> list[tuple[tuple[str, str], str, str]]:
    """(route, field, where the reference lists it) for every field of every field table."""
    out = []
    for page, h2, h3, (header, *rows) in (
            (doc, *table) for doc in API for table in field_tables(doc.read_text())):
        heading = re.match(r"(GET|POST|DELETE) (/\S*)", h2)
        where = f"{page.relative_to(DOCS)}: {h2}" + (f" / {h3}" if h3 else "")
        for row in rows:
            for name, qualifier in names(row[0]):
                if "chat" in header:  # the table of every OpenAI and vLLM field
                    routes = [route for column, route in COLUMNS.items()
                              if row[header.index(column)] and qualifier in (None, column)]
                elif heading:
                    routes = [(heading.group(1).lower(), heading.group(2))]
                else:
                    assert h3 in SECTIONS, f"a field table under {where!r}: for which route?"
                    routes = SECTIONS[h3]
                out += [(route, name, where) for route in routes]
    return out


def _has(document: dict[str, Any], schema: dict[str, Any], path: list[str]) -> bool:
    """Whether `path` (member names, `[]` for an array's items) leads somewhere in `schema`,
    through `$ref`s and every branch of `anyOf`/`oneOf`/`allOf`."""
    if not path:
        return True
    for branch in _branches(document, schema):
        if path[0] == "[]":
            if "items" in branch and _has(document, branch["items"], path[1:]):
                return True
        elif path[0] in branch.get("properties", {}) and \
                _has(document, branch["properties"][path[0]], path[1:]):
            return True
    return False


def _branches(document: dict[str, Any], schema: dict[str, Any]) -> list[dict[str, Any]]:
    if "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    out = [schema]
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            out += _branches(document, sub)
    return out


def _path(name: str) -> list[str]:
    return [p for part in name.split(".")
            for p in ([part[:-2], "[]"] if part.endswith("[]") else [part])]


def test_the_tables_are_read() -> None:
    assert len(API) > 1  # the index and the pages under docs/api/
    fields = listed()
    routes = {route for route, _, _ in fields}
    assert routes == {*GENERATION, ("post", "/v1/tokenize")}
    assert len(fields) > 200
    assert ((CHAT, "stream_options.include_usage") in {(r, n) for r, n, _ in fields})
    assert names("`tools` (`type`: `name`), `a.b` (chat), `c[].d`") == [
        ("tools", None), ("a.b", "chat"), ("c[].d", None)]
    ref = "#/components/schemas/"
    document = {"components": {"schemas": {
        "A": {"properties": {"x": {"anyOf": [{"type": "null"}, {
            "type": "array", "items": {"$ref": f"{ref}B"}}]}}},
        "B": {"allOf": [{"properties": {"y": {}}}]}}}}
    assert _has(document, {"$ref": f"{ref}A"}, _path("x[].y"))
    assert not _has(document, {"$ref": f"{ref}A"}, _path("x[].z"))
    assert not _has(document, {"$ref": f"{ref}A"}, _path("x.y"))


async def test_every_field_api_md_lists_is_in_the_served_schema(make_app) -> None:  # type: ignore[no-untyped-def]
    async with serve_in_process(make_app()) as c:
        r: httpx.Response = await c.get("/openapi.json")
    document = r.json()
    missing = []
    for (method, path), name, where in listed():
        assert NAME.fullmatch(name), f"{where}: `{name}` is not a field name (values go in " \
                                     "parentheses)"
        body = document["paths"][path][method]["requestBody"]["content"]["application/json"]
        if not _has(document, body["schema"], _path(name)):
            missing.append(f"{method.upper()} {path}: {name} ({where})")
    assert missing == []

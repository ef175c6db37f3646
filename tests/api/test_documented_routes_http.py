"""The routes the docs describe are the routes the app serves: the reference (docs/api.md and
its pages, docs/api/*.md) names every one and no other, and the ones that answer without an API
key are exactly those docs/safety.md lists (the docs once disagreed with each other about it),
found by asking every route."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from starlette.routing import Match, Route

from tests.conftest import serve_in_process

pytestmark = pytest.mark.anyio

DOCS = Path(__file__).parents[2] / "docs"
REFERENCE = [DOCS / "api.md", *sorted((DOCS / "api").glob("*.md"))]


def open_paths() -> set[str]:
    """The paths safety.md's `TOKENWIRE_API_KEYS` row names as open (`/docs/assets/`: a prefix)."""
    row = next(line for line in (DOCS / "safety.md").read_text().splitlines()
               if line.startswith("| `TOKENWIRE_API_KEYS`"))
    return set(re.findall(r"`(/[^`]*)`", row))


def served(app) -> list[Route]:  # type: ignore[no-untyped-def]
    return [r for r in app.routes if isinstance(r, Route)]


async def test_routes_without_a_key_are_the_documented_ones(make_app) -> None:  # type: ignore[no-untyped-def]
    app = make_app(api_keys=["sk-test"], admin_keys=["sk-admin"])
    routes = served(app)
    assert len(routes) > 40  # every route of the app, control plane included
    found = set()
    async with serve_in_process(app) as c:
        for route in routes:
            path = re.sub(r"\{[^}]*\}", "x", route.path)
            for method in sorted((route.methods or set()) - {"HEAD"}):
                r = await c.request(method, path, json={} if method != "GET" else None)
                if r.status_code != 401:
                    found.add(route.path.split("{")[0])  # a parameter's route: its prefix
                elif "error_type" in r.json():  # TGI's shape on its routes
                    assert r.json()["error_type"] == "invalid_api_key", (path, r.json())
                else:  # OpenAI's error shape, or Anthropic's on its routes
                    error = r.json()["error"]
                    assert error.get("code") == "invalid_api_key" \
                        or error["type"] == "authentication_error", (path, error)
        assert found == open_paths()
        # an open path opens nothing beside it
        for path in ("/healthz", "/health/x", "/docsx", "/docs/assets", "/openapi.jsonx",
                     "/pingx"):
            assert (await c.get(path)).status_code == 401, path


def test_api_md_names_every_route_and_no_other(make_app) -> None:  # type: ignore[no-untyped-def]
    """Each route's path appears in the reference (a parameter as any `{name}`, a prefix route by
    its prefix), and each `METHOD /path` it shows is one the app serves."""
    assert len(REFERENCE) > 1
    text = "\n".join(page.read_text() for page in REFERENCE)
    routes = served(make_app())
    missing = []
    for route in routes:
        prefix, _, rest = route.path.partition("{")
        if rest.endswith("}") and "/" not in rest and prefix.endswith("/") and \
                f"`{prefix}`" in text:
            continue  # `/docs/assets/`: a prefix, documented as one
        pattern = re.escape(re.sub(r"\{[^}]*\}", "\0", route.path)).replace("\0", r"\{[^}`]*\}")
        if not re.search(rf"(?<![\w/]){pattern}(?![\w/{{])", text):
            missing.append(route.path)
    assert missing == []
    unknown = []
    for method, path in re.findall(r"\b(GET|POST|DELETE) (/[^\s`\"'|)\[]*)", text):
        scope = {"type": "http", "method": method, "path": path.split("?")[0].rstrip(".,;:")}
        if not any(r.matches(scope)[0] is Match.FULL for r in routes):
            unknown.append(f"{method} {path}")
    assert unknown == []

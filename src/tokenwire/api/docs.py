"""GET /docs: Swagger UI on GET /openapi.json. Its script and styles come from the
swagger-ui-py package and are served from here: the page loads nothing from elsewhere."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import Route

from ..errors import NotFoundError
from .openapi import openapi_json

__all__ = ["docs_routes"]


def _assets_dir() -> Path:
    # the package's files only: importing it would load its web-framework glue for nothing
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the swagger-ui-py package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


_ASSETS = {
    "swagger-ui.css": "text/css; charset=utf-8",
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "favicon-32x32.png": "image/png",
    "LICENSE": "text/plain; charset=utf-8",
}

# relative links: right behind a proxy that mounts the server under a prefix too.
# validatorUrl null: Swagger UI would otherwise send the document to validator.swagger.io
_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>tokenwire API</title>
<link rel="stylesheet" href="docs/assets/swagger-ui.css">
<link rel="icon" type="image/png" href="docs/assets/favicon-32x32.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="docs/assets/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({url: "openapi.json", dom_id: "#swagger-ui", deepLinking: true,
                             validatorUrl: null});
</script>
</body>
</html>
"""


async def docs_page(request: Request) -> Response:
    return HTMLResponse(_PAGE)


async def docs_asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in _ASSETS:
        raise NotFoundError(f"no docs asset {name!r}")
    return FileResponse(_assets_dir() / name, media_type=_ASSETS[name],
                        headers={"Cache-Control": "public, max-age=86400"})


docs_routes = [
    Route("/openapi.json", openapi_json, methods=["GET"]),
    Route("/docs", docs_page, methods=["GET"]),
    Route("/docs/assets/{name}", docs_asset, methods=["GET"]),
]

"""The floor of a relay on tokenwire's own HTTP stack: uvicorn (uvloop, httptools) serving a bare
ASGI app, aiohttp reading the upstream, each server-sent event's JSON decoded and encoded
again, and each event sent as its own ASGI message (as a token's chunk is). With `--starlette`
the same relay as a Starlette route behind one pure-ASGI middleware (tokenwire's app has
Starlette's two exception layers and three middlewares of its own).

Beside bench/_floor.py (raw asyncio protocols) it splits what a Python gateway pays per token
into the stack's share and its own: bench/gateways.py `--paced-ms` runs both.

    python bench/_floor_stack.py --port 8201 --upstream http://127.0.0.1:8100 [--starlette]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import aiohttp
import uvicorn

Scope = dict[str, Any]


def make_app(upstream: str, starlette: bool) -> Any:
    session: aiohttp.ClientSession | None = None

    async def relay(scope: Scope, receive: Any, send: Any) -> None:
        nonlocal session
        if session is None:
            session = aiohttp.ClientSession()
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        method = scope["method"]
        async with session.request(method, upstream + scope["path"], data=body or None,
                                   headers={"Content-Type": "application/json"}) as resp:
            if resp.content_type != "text/event-stream":
                data = await resp.read()
                await send({"type": "http.response.start", "status": resp.status,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": data})
                return
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(b"content-type", b"text/event-stream")]})
            async for line in resp.content:
                if line.startswith(b"data: ["):
                    frame = line.rstrip(b"\n") + b"\n\n"
                elif line.startswith(b"data:"):
                    frame = b"data: " + json.dumps(json.loads(line[5:]),
                                                   separators=(",", ":")).encode() + b"\n\n"
                else:
                    continue
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await relay(scope, receive, send)

    if not starlette:
        return app
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    class Passing:  # one pure-ASGI middleware that sees every send, as tokenwire's metrics do
        def __init__(self, inner: Any):
            self.inner = inner

        async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
            async def noted(message: dict[str, Any]) -> None:
                await send(message)
            await self.inner(scope, receive, noted)

    class Relay:  # an ASGI endpoint: Starlette calls it as an app
        async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
            await relay(scope, receive, send)

    return Starlette(routes=[Route("/{path:path}", Relay(), methods=["GET", "POST"])],
                     middleware=[Middleware(Passing)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="http://host:port")
    p.add_argument("--starlette", action="store_true")
    a = p.parse_args()
    uvicorn.run(make_app(a.upstream.rstrip("/"), a.starlette), host="127.0.0.1", port=a.port,
                loop="uvloop", http="httptools", log_level="warning", access_log=False)


if __name__ == "__main__":
    main()

"""An upstream that costs nothing: it replays a real vLLM's recorded responses, each event
written as soon as the socket takes it, so what a gateway in front of it can relay is bounded
by the gateway (and the client), not by an engine; with `--interval-ms`, paced as an
engine's decode steps (each event its own read, as a real upstream's). bench/gateways.py
records the responses from a real vLLM and starts this in a process of its own.

    python bench/_stub.py --port 8100 --recorded recorded.json --tokenizer model.gguf

`recorded.json` holds, each as vLLM sent it: `generate` (the data lines of a streamed
/inference/v1/generate), `generate_logprobs` (the same with logprobs), `generate_whole` (an
unstreamed one with logprobs, for a gateway that asks for whole answers), `chat` (a streamed
/v1/chat/completions), `chat_whole` (an unstreamed one, `n` choices with logprobs), and
`models` (its /v1/models body). Routes answer by what a request asks, not by its prompt: the
benchmark sends what was recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from aiohttp import web

from tokenwire.tokenizers.source import load_tokenizer

SSE = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def _frames(lines: list[str]) -> list[bytes]:
    return [b"data: " + line.encode() + b"\n\n" for line in lines] + [b"data: [DONE]\n\n"]


def make_app(recorded: dict[str, Any], tokenize: Any, interval: float = 0.0) -> web.Application:
    generate = _frames(recorded["generate"])
    generate_lp = _frames(recorded["generate_logprobs"])
    chat = _frames(recorded["chat"])
    chat_whole = json.dumps(recorded["chat_whole"]).encode()
    generate_whole = json.dumps(recorded["generate_whole"]).encode() \
        if "generate_whole" in recorded else None
    models = json.dumps(recorded["models"]).encode()

    async def replay(request: web.Request, frames: list[bytes]) -> web.StreamResponse:
        resp = web.StreamResponse(headers=SSE)
        await resp.prepare(request)
        for f in frames:
            await resp.write(f)
            if interval:
                await asyncio.sleep(interval)
        return resp

    async def on_generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body:  # a gateway's start-up probe: the endpoint is live
            return web.json_response({"error": {"message": "token_ids: Field required"}},
                                     status=400)
        if body.get("stream") is False and generate_whole is not None:
            return web.Response(body=generate_whole, content_type="application/json")
        lp = (body.get("sampling_params") or {}).get("logprobs") is not None
        return await replay(request, generate_lp if lp else generate)

    async def on_chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream"):
            return await replay(request, chat)
        return web.Response(body=chat_whole, content_type="application/json")

    async def on_tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"tokens": tokenize(body.get("prompt", ""))})

    async def on_models(request: web.Request) -> web.Response:
        return web.Response(body=models, content_type="application/json")

    async def ok(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.add_routes([web.post("/inference/v1/generate", on_generate),
                    web.post("/v1/chat/completions", on_chat),
                    web.post("/tokenize", on_tokenize), web.get("/v1/models", on_models),
                    web.get("/health", ok)])
    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--recorded", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, required=True, help="the model's GGUF")
    ap.add_argument("--interval-ms", type=float, default=0.0,
                    help="a pause after each event, as an engine's decode step (0: none)")
    args = ap.parse_args()
    tok = load_tokenizer(args.tokenizer).tokenizer
    recorded = json.loads(args.recorded.read_text())
    web.run_app(make_app(recorded, lambda text: tok.encode(text), args.interval_ms / 1000),
                host="127.0.0.1",
                port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()

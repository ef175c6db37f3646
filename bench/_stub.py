"""An upstream that costs nothing: it replays a real vLLM's recorded responses, each event
written as soon as the socket takes it, so what a gateway in front of it can relay is bounded
by the gateway (and the client), not by an engine; with `--interval-ms`, paced as an
engine's decode steps (each event its own read, as a real upstream's); with `--tick-ms`, paced
as a GPU engine's batch is (bench/sweep.py): one shared ticker for every open response, each
stream's next event written at every tick, a whole answer sent once its tokens' ticks have
passed. bench/gateways.py records the responses from a real vLLM and starts this in a process
of its own.

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


class Ticker:
    """One decode step for every open response at once: `after(k)` resolves at the k-th tick
    from now; the wake-ups of one tick come together, as a batch's tokens do."""

    def __init__(self, interval: float):
        self.interval = interval
        self._now = 0
        self._due: dict[int, list[asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None

    def after(self, ticks: int) -> asyncio.Future[None]:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        fut = asyncio.get_running_loop().create_future()
        self._due.setdefault(self._now + max(1, ticks), []).append(fut)
        return fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += self.interval
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            self._now += 1
            for fut in self._due.pop(self._now, ()):
                if not fut.done():
                    fut.set_result(None)


def make_app(recorded: dict[str, Any], tokenize: Any, interval: float = 0.0,
             tick: float = 0.0) -> web.Application:
    generate = _frames(recorded["generate"])
    generate_lp = _frames(recorded["generate_logprobs"])
    chat = _frames(recorded["chat"])
    chat_whole = json.dumps(recorded["chat_whole"]).encode()
    generate_whole = json.dumps(recorded["generate_whole"]).encode() \
        if "generate_whole" in recorded else None
    models = json.dumps(recorded["models"]).encode()
    # a whole answer waits as many ticks as it has tokens
    whole_tokens = len(recorded["generate_whole"]["choices"][0]["token_ids"]) \
        if "generate_whole" in recorded else len(recorded["generate"])

    ticker = Ticker(tick)  # interval 0: not paced

    async def replay(request: web.Request, frames: list[bytes]) -> web.StreamResponse:
        resp = web.StreamResponse(headers=SSE)
        await resp.prepare(request)
        for f in frames:
            if ticker.interval:
                await ticker.after(1)
            await resp.write(f)
            if interval:
                await asyncio.sleep(interval)
        return resp

    async def whole(body: bytes, tokens: int) -> web.Response:
        if ticker.interval:  # the answer is ready once its tokens are sampled
            await ticker.after(tokens)
        return web.Response(body=body, content_type="application/json")

    async def on_generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body:  # a gateway's start-up probe: the endpoint is live
            return web.json_response({"error": {"message": "token_ids: Field required"}},
                                     status=400)
        if body.get("stream") is False and generate_whole is not None:
            return await whole(generate_whole, whole_tokens)
        lp = (body.get("sampling_params") or {}).get("logprobs") is not None
        return await replay(request, generate_lp if lp else generate)

    async def on_chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream"):
            return await replay(request, chat)
        return await whole(chat_whole, whole_tokens)

    async def on_tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"tokens": tokenize(body.get("prompt", ""))})

    async def on_models(request: web.Request) -> web.Response:
        return web.Response(body=models, content_type="application/json")

    async def ok(request: web.Request) -> web.Response:
        return web.Response()

    async def on_tick(request: web.Request) -> web.Response:
        """bench/sweep.py's next level: another tick (seconds), for responses from now on."""
        ticker.interval = float((await request.json())["seconds"])
        return web.Response()

    app = web.Application()
    app.add_routes([web.post("/inference/v1/generate", on_generate),
                    web.post("/v1/chat/completions", on_chat),
                    web.post("/tokenize", on_tokenize), web.get("/v1/models", on_models),
                    web.get("/health", ok), web.post("/tick", on_tick)])
    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--recorded", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, required=True, help="the model's GGUF")
    ap.add_argument("--interval-ms", type=float, default=0.0,
                    help="a pause after each event, as an engine's decode step (0: none)")
    ap.add_argument("--tick-ms", type=float, default=0.0,
                    help="one shared decode step for every open response (0: none)")
    args = ap.parse_args()
    tok = load_tokenizer(args.tokenizer).tokenizer
    recorded = json.loads(args.recorded.read_text())
    web.run_app(make_app(recorded, lambda text: tok.encode(text), args.interval_ms / 1000,
                         args.tick_ms / 1000),
                host="127.0.0.1",
                port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()

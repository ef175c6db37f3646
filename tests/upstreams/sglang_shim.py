"""A process that speaks SGLang's native protocol over the real llama.cpp engine and model.

SGLang cannot run here (no GPU; the CPU lacks AVX2), so the `sglang` engine is tested against
this: the request, stream and error shapes of SGLang 0.5.23 as its source defines them
(`srt/managers/io_struct.py`, `srt/entrypoints/http_server.py`, the contract in
`api/v1/api_types.py`; recorded in tests/engines/shapes/sglang/), on a real model, so greedy
output through the gateway can be compared with the embedded engine's token for token. Its
control endpoints (pause, continue, flush, weight versions, weights from disk) are SGLang's
shapes over the embedded engine's own control plane.

    python -m tests.upstreams.sglang_shim --port 30000 [--incremental] [--deterministic]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tokenwire.config import default_model_path
from tokenwire.engines.base import FinishEvent, PromptLogprobsEvent, SamplingParams, TokenEvent
from tokenwire.engines.llamacpp import LlamaCppEngine
from tokenwire.errors import TokenwireError

#: sampling keys of SGLang 0.5.23's contract (api_types.py _FIELDS_SamplingParams)
KNOWN_SAMPLING = {"max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature",
                  "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                  "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex", "ebnf",
                  "structural_tag", "ignore_eos", "skip_special_tokens",
                  "spaces_between_special_tokens", "no_stop_trim", "stream_interval",
                  "logit_bias", "sampling_seed", "custom_params", "beam_width", "watermark",
                  "choice"}
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def make_app(engine: LlamaCppEngine, *, incremental: bool, deterministic: bool) -> Starlette:
    def triple(t: int, lp: float | None) -> list[Any]:
        return [lp, t, None]

    async def generate(request: Request) -> Response:
        body = json.loads(await request.body())
        sp = body.get("sampling_params") or {}
        unknown = sorted(set(sp) - KNOWN_SAMPLING)
        if unknown:
            return JSONResponse({"error": f"unknown field `{unknown[0]}`"}, status_code=400)
        ids = body.get("input_ids")
        if not ids:
            return JSONResponse({"error": {"message": "input_ids cannot be empty."}},
                                status_code=400)
        info = engine.info
        if len(ids) >= info.max_model_len:
            return JSONResponse({"error": {"message": f"The input ({len(ids)} tokens) is longer "
                                 f"than the model's context length ({info.max_model_len} "
                                 "tokens)."}}, status_code=400)
        k = int(body.get("top_logprobs_num") or 0)
        want_lp = bool(body.get("return_logprob"))
        score = want_lp and body.get("logprob_start_len", -1) == 0
        stops = frozenset(sp.get("stop_token_ids") or [])
        params = SamplingParams(
            max_tokens=sp.get("max_new_tokens", 128), temperature=sp.get("temperature", 1.0),
            top_p=sp.get("top_p", 1.0),
            seed=sp.get("sampling_seed") if deterministic else None,
            logprobs=k if want_lp else None, prompt_logprobs=k if score else None,
            presence_penalty=sp.get("presence_penalty", 0.0),
            frequency_penalty=sp.get("frequency_penalty", 0.0),
            stop_token_ids=stops, ignore_eos=bool(sp.get("ignore_eos")),
            top_k=max(0, sp.get("top_k", -1)), min_p=sp.get("min_p", 0.0),
            min_tokens=sp.get("min_new_tokens", 0),
            logit_bias=tuple((int(t), b) for t, b in (sp.get("logit_bias") or {}).items()))
        rid = body.get("rid") or uuid.uuid4().hex
        try:
            stream = await engine.submit(ids, params)
        except TokenwireError as exc:
            return JSONResponse({"error": {"message": exc.message}}, status_code=400)
        out: list[int] = []
        lps: list[list[Any]] = []
        tops: list[list[list[Any]]] = []
        meta: dict[str, Any] = {"id": rid, "prompt_tokens": len(ids), "cached_tokens": 0}

        def chunk(new: int, finish: dict[str, Any] | None) -> dict[str, Any]:
            """Cumulative by default, the last `new` entries when streaming --incremental."""
            cut = slice(len(out) - new, None) if incremental and body.get("stream") \
                else slice(None)
            m = {**meta, "finish_reason": finish, "completion_tokens": len(out)}
            if want_lp:
                m["output_token_logprobs"] = lps[cut]
                m["output_top_logprobs"] = tops[cut]
            return {"text": "", "output_ids": out[cut], "meta_info": m}

        def take(ev: TokenEvent) -> None:
            out.append(ev.token_id)
            if want_lp:
                lps.append(triple(ev.token_id, ev.logprob))
                tops.append([triple(t, lp) for t, lp in ev.top_logprobs])

        async def events() -> AsyncIterator[dict[str, Any]]:
            async for ev in stream:
                if isinstance(ev, PromptLogprobsEvent):
                    meta["input_token_logprobs"] = [triple(ids[0], None)] + [
                        triple(e.token_id, e.logprob) for e in ev.entries]
                    meta["input_top_logprobs"] = [None] + [
                        [triple(t, lp) for t, lp in e.top_logprobs] for e in ev.entries]
                elif isinstance(ev, TokenEvent):
                    take(ev)
                    yield chunk(1, None)
                elif isinstance(ev, FinishEvent):
                    new = 0
                    if ev.stop_token is not None:  # SGLang keeps the matched id in output_ids
                        take(ev.stop_token)
                        new = 1
                        finish = {"type": "stop", "matched": ev.stop_token.token_id}
                    elif ev.reason == "abort":  # a running request's FINISH_ABORT().to_json()
                        finish = {"type": "abort", "message": "Aborted", "status_code": None,
                                  "err_type": None}
                    else:
                        finish = {"type": "length", "length": params.max_tokens}
                    if ev.weight_versions:  # SGLang's finished outputs carry their spans
                        meta["weight_versions"] = [
                            {"version": w.version, "start": w.start, "end": w.end}
                            for w in ev.weight_versions]
                    yield chunk(new, finish)

        if not body.get("stream"):
            last: dict[str, Any] = {}
            async for c in events():
                last = c
            return JSONResponse(last)

        async def sse() -> AsyncIterator[bytes]:
            try:
                async for c in events():
                    yield b"data: " + json.dumps(c).encode() + b"\n\n"
            finally:
                await stream.aclose()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": MODEL, "object": "model", "created": 0, "owned_by": "sglang", "root": MODEL,
            "parent": None, "max_model_len": engine.info.max_model_len}]})

    async def server_info(request: Request) -> Response:
        return JSONResponse({"model_path": MODEL, "served_model_name": MODEL,
                             "incremental_streaming_output": incremental,
                             "enable_deterministic_inference": deterministic,
                             "status": "ready", "version": "0.5.23"})

    async def tokenize(request: Request) -> Response:
        body = json.loads(await request.body())
        ids = engine.llama.tokenize(body["prompt"], parse_special=True)
        return JSONResponse({"tokens": ids, "count": len(ids),
                             "max_model_len": engine.info.max_model_len})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    # -- the RL control endpoints (http_server.py, io_struct.py of 0.5.23) ----------------

    async def pause_generation(request: Request) -> Response:
        mode = json.loads(await request.body()).get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return JSONResponse({"object": "error", "message": f"bad mode {mode!r}",
                                 "type": "Bad Request", "param": None, "code": 400}, 400)
        await engine.pause("abort" if mode == "abort" else "keep")
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(request: Request) -> Response:
        await engine.resume()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    async def flush_cache(request: Request) -> Response:
        if engine.n_active:  # only an idle server flushes (timeout 0)
            return PlainTextResponse("Flush cache failed.\n", 400)
        await engine.reset_prefix_cache()
        return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details. "
                                 "(When there are running or waiting requests, the operation "
                                 "will not be performed.)\n")

    async def update_weight_version(request: Request) -> Response:
        body = json.loads(await request.body())
        if body.get("abort_all_requests", True):  # SGLang's default
            await engine.pause("abort")
            await engine.resume()
        await engine.set_weight_version(body["new_version"])
        return JSONResponse({"success": True, "new_version": body["new_version"],
                             "message": f"Weight version updated to {body['new_version']}"})

    async def model_info(request: Request) -> Response:
        return JSONResponse({"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True,
                             "weight_version": engine.weight_version})

    async def update_weights_from_disk(request: Request) -> Response:
        body = json.loads(await request.body())
        try:
            await engine.load_weights(Path(body["model_path"]), body.get("weight_version"))
        except TokenwireError as exc:
            return JSONResponse({"success": False, "message": exc.message,
                                 "num_paused_requests": 0}, 400)
        return JSONResponse({"success": True, "message": "Succeeded to update model weights.",
                             "num_paused_requests": 0})

    return Starlette(routes=[
        Route("/generate", generate, methods=["POST", "PUT"]),
        Route("/v1/models", models), Route("/server_info", server_info),
        Route("/tokenize", tokenize, methods=["POST"]), Route("/health", health),
        Route("/pause_generation", pause_generation, methods=["POST"]),
        Route("/continue_generation", continue_generation, methods=["POST"]),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
        Route("/update_weight_version", update_weight_version, methods=["POST"]),
        Route("/model_info", model_info),
        Route("/update_weights_from_disk", update_weights_from_disk, methods=["POST"])])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--incremental", action="store_true")
    p.add_argument("--deterministic", action="store_true")
    args = p.parse_args()
    engine = LlamaCppEngine(default_model_path(), max_model_len=args.max_model_len,
                            n_parallel=4)
    app = make_app(engine, incremental=args.incremental, deterministic=args.deterministic)

    async def serve() -> None:
        await engine.start()
        try:
            await uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=args.port,
                                                log_level="warning")).serve()
        finally:
            await engine.aclose()

    asyncio.run(serve())


if __name__ == "__main__":
    main()

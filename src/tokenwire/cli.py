"""`tokenwire serve | tokenize | detokenize | chat`."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import uvicorn

    from .client import Client
    from .config import Settings
    from .tokenizers.hf import HFTokenizer

__all__ = ["main"]


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    import uvicorn
    from pydantic import ValidationError

    from .config import Settings

    overrides = {k: v for k, v in {
        "models": args.model, "models_file": args.models_file, "host": args.host, "port": args.port,
        "served_model_name": args.served_model_name, "max_model_len": args.max_model_len,
        "n_parallel": args.n_parallel, "engine": args.engine, "upstream": args.upstream,
        "tokenizer": args.tokenizer, "upstream_model": args.upstream_model,
        "prefix_cache": args.prefix_cache, "default_max_tokens": args.default_max_tokens,
        "n_threads": args.n_threads, "n_batch": args.n_batch,
        "deterministic": args.deterministic, "logprobs_mode": args.logprobs_mode,
        "return_sampling_mask": args.return_sampling_mask, "workers": args.workers,
        "http_server": args.http_server,
        "engine_process": args.engine_process, "cpu_variant": args.cpu_variant,
        "reasoning_parser": args.reasoning_parser, "tool_call_parser": args.tool_call_parser,
        "weight_version_policy": args.weight_version_policy,
        "trainer_model": args.trainer_model,
    }.items() if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            where = ".".join(map(str, err["loc"]))
            print(f"tokenwire serve: {where + ': ' if where else ''}{err['msg']}",
                  file=sys.stderr)
        return 2
    from .api.startup import configure_logging
    from .engines.embedded import gave_up

    configure_logging(settings)

    if settings.max_workers > 1:
        from .api.worker import supervise

        code = supervise(settings, {**overrides, "workers": settings.max_workers})
    else:
        config = uvicorn.Config("", host=settings.host, port=settings.port,  # the app later
                                log_level=settings.log_level, timeout_graceful_shutdown=30)
        # uvicorn's own loop choice (uvloop when installed), as uvicorn.run would make it
        with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
            code = runner.run(_serve_async(settings, config))
    if gave_up():
        print(f"tokenwire serve: stopped: {gave_up()[0]}", file=sys.stderr)
        return 1
    return code


async def _serve_async(settings: Settings, config: uvicorn.Config) -> int:
    """Load the model first, so a refusal to start is one clear line, then serve on the same
    event loop."""
    import uvicorn

    from .api.app import create_app
    from .api.startup import preload
    from .engines.embedded import exit_on_give_up, gave_up

    loaded = await preload(settings)
    if loaded is None:
        return 1
    models, tokenizers = loaded
    config.app = create_app(settings, models=models, tokenizers=tokenizers)
    if settings.http_server == "granian":
        return await _serve_granian(settings, config.app)
    server = uvicorn.Server(config)
    # an engine process that cannot be restarted ends the server (then exit 1: `_serve`)
    exit_on_give_up(lambda: setattr(server, "should_exit", True))
    if gave_up():
        return 1
    await server.serve()
    return 0


async def _serve_granian(settings: Settings, app: object) -> int:
    """The app under granian's embedded server (HTTP/1.1), on this event loop."""
    from granian.constants import HTTPModes, Interfaces
    from granian.log import LogLevels
    from granian.server.embed import Server

    from .engines.embedded import exit_on_give_up, gave_up

    server = Server(app, address=settings.host, port=settings.port, interface=Interfaces.ASGI,
                    http=HTTPModes.http1, log_level=LogLevels(settings.log_level.lower()),
                    backlog=2048)
    exit_on_give_up(server.stop)
    if gave_up():
        return 1
    await server.serve()
    return 0


class _UsageError(Exception):
    """A bad argument: one line on stderr, exit 2 (as argparse's own)."""


def _reason(exc: BaseException) -> str:
    """An OS-level failure in words: `[Errno 111] Connection refused` -> `connection refused`."""
    text = re.sub(r"^\[Errno -?\d+\]\s*", "", str(exc).strip()) or type(exc).__name__
    return text[:1].lower() + text[1:]


def _explain(exc: Exception, args: argparse.Namespace) -> str:
    """A client-side failure as one line that names the flag to change."""
    import httpx
    from pydantic import ValidationError

    from .errors import (
        APIConnectionError,
        AuthenticationError,
        ModelNotFoundError,
        NotFoundError,
        TokenizerNotFoundError,
        UnknownTokenizerVersionError,
    )

    server = args.server
    has_v1 = server.rstrip("/").endswith("/v1")
    if isinstance(exc, APIConnectionError):
        cause = exc.__cause__
        if isinstance(cause, httpx.UnsupportedProtocol):
            return f"{server!r} is not an http:// or https:// URL (--server " \
                   "http://HOST:PORT/v1)"
        if isinstance(cause, httpx.TimeoutException):
            return f"{server} did not answer in time: is it a tokenwire server? (--server)"
        if isinstance(cause, httpx.ConnectError):
            return f"cannot reach {server}: {_reason(cause)} — is `tokenwire serve` running " \
                   "there? (--server)"
        return f"the connection to {server} failed: {_reason(cause or exc)} (--server)"
    if isinstance(exc, AuthenticationError):
        if args.api_key is None:
            return f"{server} needs an API key: pass it with --api-key"
        return f"{server} refused the API key: {exc} (--api-key)"
    if isinstance(exc, ModelNotFoundError):
        return f"{exc} (--model)"
    if isinstance(exc, TokenizerNotFoundError | UnknownTokenizerVersionError):
        return f"{exc} (--tokenizer-version)"
    if isinstance(exc, NotFoundError | ValidationError | ValueError) or \
            getattr(exc, "code", "") is None:
        # a route that is not there, or an answer that is not ours (an error without an
        # OpenAI-shaped body has no code): not tokenwire's API root
        origin = httpx.URL(server).copy_with(path="/", query=None, fragment=None)
        hint = f"the base URL ends in /v1: --server {str(origin).rstrip('/')}/v1" \
            if not has_v1 else "is --server a tokenwire server's base URL?"
        what = "has no tokenwire API" if isinstance(exc, NotFoundError) else \
            "did not answer as a tokenwire server"
        return f"{server} {what} ({hint})"
    return f"{server}: {exc}"


def _client(args: argparse.Namespace) -> Client:
    from .client import Client

    return Client(args.server, api_key=args.api_key)


def _model(client: Client, args: argparse.Namespace) -> str:
    return str(args.model or client.models()[0].id)


def _local(path: Path) -> HFTokenizer:
    """A local tokenizer.json; its version is the one a server gives the same tokenizer."""
    from .tokenizers.hf import HFTokenizer

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _UsageError(f"cannot read --artifact {str(path)!r}: {_reason(exc)}") from exc
    try:
        return HFTokenizer(data)
    except Exception as exc:  # the tokenizers library's own error types
        raise _UsageError(f"--artifact {str(path)!r} is not a tokenizer.json: {exc}") from exc


def _tokenize(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    if args.artifact:
        tok = _local(args.artifact)
        ids = tok.encode(text)
        out: dict[str, object] = {"tokens": ids, "count": len(ids),
                                  "tokenizer_version": tok.version}
        if args.strs:
            out["token_strs"] = [tok.token_str(i) for i in ids]
    else:
        with _client(args) as client:
            model = None if args.tokenizer_version else _model(client, args)
            r = client.tokenize(text, model=model, tokenizer_version=args.tokenizer_version,
                                return_token_strs=args.strs)
            out = r.model_dump(exclude_none=True)
    print(json.dumps(out, ensure_ascii=False))
    return 0


def _parse_ids(values: Sequence[str]) -> list[int]:
    joined = " ".join(values).strip()
    try:
        if joined.startswith("["):
            return [int(x) for x in json.loads(joined)]
        return [int(x) for x in joined.replace(",", " ").split()]
    except (ValueError, TypeError) as exc:
        raise _UsageError(f"ids must be integers (space/comma separated, or a JSON array): "
                          f"{joined[:60]!r}") from exc


def _detokenize(args: argparse.Namespace) -> int:
    ids = _parse_ids(args.ids if args.ids != ["-"] else [sys.stdin.read()])
    if args.artifact:
        print(_local(args.artifact).decode(ids))
        return 0
    with _client(args) as client:
        version = args.tokenizer_version or client.tokenizer_version(_model(client, args))
        print(client.detokenize(ids, tokenizer_version=version).prompt)
    return 0


def _chat(args: argparse.Namespace) -> int:
    """An interactive chat that keeps the whole conversation in token ids."""
    with _client(args) as client:
        model = _model(client, args)
        history: list[dict[str, object]] = []
        if args.system:
            history.append({"role": "system", "content": args.system})
        while True:
            try:
                line = input("> ")
            except EOFError:
                print()
                return 0
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            sampled: list[int] = []
            stream = client.chat(model, history, stream=True, max_tokens=args.max_tokens,
                                 temperature=args.temperature)
            for chunk in stream:
                for ch in chunk.choices:
                    print(ch.delta.content or "", end="", flush=True)
                    sampled += ch.delta.token_ids or []
            print()
            if args.ids:
                print(f"[ids] {sampled}")
            history.append({"role": "assistant", "token_ids": sampled})


def _export_rollouts(args: argparse.Namespace) -> int:
    """The stored completions of one API key (chat and /inference/v1/generate) as rollout
    rows, linked into trajectories, in a Parquet file."""
    import asyncio

    from .config import Settings
    from .rl.rollouts import stored_rollouts, write_parquet
    from .storage import open_store, owner_of

    metadata = dict(_pair(x) for x in args.metadata or [])
    url = args.storage or Settings().storage_url()
    if url is None:
        raise _UsageError("the server keeps no records (storage none): name --storage")

    async def rows() -> list[dict[str, object]]:
        store = open_store(url)
        try:
            return [r async for r in stored_rollouts(store, owner_of(args.api_key),
                                                     model=args.model,
                                                     metadata=metadata or None)]
        finally:
            await store.aclose()

    n = write_parquet(asyncio.run(rows()), args.out)
    print(f"{n} rollouts -> {args.out}")
    return 0


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise _UsageError(f"--metadata takes KEY=VALUE, not {text!r}")
    return key, value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenwire", description="Token-native LLM API server.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve a model over the OpenAI-compatible API: a GGUF in "
                       "this process, or a model on upstream servers (vLLM, SGLang, ...)")
    s.add_argument("--engine", help="embedded (default), vllm, sglang, llama-server, openai")
    s.add_argument("--upstream", action="append",
                   help="base URL of an upstream replica (repeat for several)")
    s.add_argument("--tokenizer", type=Path, help="the upstream model's tokenizer: a Hugging "
                   "Face tokenizer directory or a GGUF file")
    s.add_argument("--upstream-model", help="model name to send upstream (default: its own)")
    s.add_argument("--model", action="append", metavar="SOURCE[,KEY=VALUE...]",
                   help="a GGUF file or a shipped model's short name (smollm2-135m, the "
                   "default; gemma3-270m; smollm2-think, a small model that reasons, made by "
                   "`make think-model`), then its own settings: name, max_model_len, "
                   "n_parallel, n_batch, n_threads, max_queued, prefix_cache, chat_template, "
                   "reasoning_parser, tool_call_parser; repeat for several models "
                   "(docs/deploy.md)")
    s.add_argument("--models-file", type=Path, help="a TOML file of [[model]] tables")
    s.add_argument("--reasoning-parser", help="how the model's reasoning is split from its "
                   "answer: auto (from the chat template, the default), none, qwen3, "
                   "deepseek_r1")
    s.add_argument("--tool-call-parser", help="the format tool calls are written in: auto "
                   "(from the chat template, the default), hermes, llama3_json, mistral, "
                   "deepseek_v3, deepseek_v31, qwen3_coder")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.add_argument("--served-model-name")
    s.add_argument("--max-model-len", type=int)
    s.add_argument("--n-parallel", type=int)
    s.add_argument("--n-batch", type=int)
    s.add_argument("--n-threads", type=int)
    s.add_argument("--default-max-tokens", type=int,
                   help="most tokens a request without max_tokens samples (default 2048; 0: "
                   "all the room its prompt leaves)")
    s.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_const", const=False,
                   help="prefill every prompt in full (llama.cpp's logprobs depend on how a "
                   "prompt reached the KV cache; see docs/engines.md)")
    s.add_argument("--deterministic", action="store_const", const=True,
                   help="embedded engine: each sequence decoded alone, no cached prefix, so "
                   "its output does not depend on what else runs (costs the batching)")
    s.add_argument("--logprobs-mode", choices=["raw_logprobs", "processed_logprobs",
                                               "raw_logits", "processed_logits"],
                   help="vLLM's: what logprobs report, of the model's distribution (raw, "
                   "the default) or of the one the sampler drew from (processed)")
    s.add_argument("--workers", type=int, help="serving processes on the port (default: "
                   "one per core for upstream engines, one for the embedded engine)")
    s.add_argument("--http-server", choices=["uvicorn", "granian"],
                   help="the HTTP server under the app (default uvicorn; granian: the "
                   "`granian` extra, one worker)")
    s.add_argument("--no-engine-process", dest="engine_process", action="store_const",
                   const=False, help="run the embedded engine in the server's process (a "
                   "native crash then ends the server; for profilers)")
    s.add_argument("--cpu-variant", help="ggml CPU kernels to load (haswell, zen4, ...; "
                   "default: the best this CPU runs)")
    s.add_argument("--return-sampling-mask", action="store_const", const=True,
                   help="vLLM's: each sampled token on /inference/v1/generate lists the ids "
                   "the sampler could have drawn (needs --logprobs-mode processed_logprobs)")
    s.add_argument("--weight-version-policy", help="which weights may serve a request that "
                   "names no bound (smg's names): any (default), latest-only, "
                   "min-version:<label>, max-staleness:<k>")
    s.add_argument("--trainer-model", type=Path, help="Tinker's training API (the rl extra): "
                   "the served model's weights as a Hugging Face directory, for its trainer")
    s.set_defaults(func=_serve)

    def remote(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--server", default="http://127.0.0.1:8000/v1", help="base URL")
        sp.add_argument("--api-key", default=None)
        sp.add_argument("--model", help="default: the server's first model")

    t = sub.add_parser("tokenize", help="text -> ids, on a server or a local tokenizer.json")
    t.add_argument("text", help="the text, or - for standard input")
    remote(t)
    t.add_argument("--tokenizer-version", help="tokenize with this version, not a model's")
    t.add_argument("--artifact", type=Path, help="a local tokenizer.json instead of a server")
    t.add_argument("--strs", action="store_true", help="also print each id's vocabulary entry")
    t.set_defaults(func=_tokenize)

    d = sub.add_parser("detokenize", help="ids -> text, on a server or a local tokenizer.json")
    d.add_argument("ids", nargs="+", help="ids (space/comma separated, or a JSON array, or -)")
    remote(d)
    d.add_argument("--tokenizer-version")
    d.add_argument("--artifact", type=Path)
    d.set_defaults(func=_detokenize)

    e = sub.add_parser("export-rollouts", help="stored completions (chat, and "
                       "/inference/v1/generate) as rollout rows (ids, loss mask, logprobs, "
                       "trajectory, weight versions, reward) in a Parquet file")
    e.add_argument("--out", type=Path, required=True, help="the Parquet file to write")
    e.add_argument("--storage", help="the server's store (default: its storage setting)")
    e.add_argument("--api-key", help="whose records (the key that stored them; none on a "
                   "server without keys)")
    e.add_argument("--model", help="only records of this model")
    e.add_argument("--metadata", action="append", metavar="KEY=VALUE",
                   help="only records whose metadata holds every pair")
    e.set_defaults(func=_export_rollouts)

    c = sub.add_parser("chat", help="interactive streaming chat, kept in token ids")
    remote(c)
    c.add_argument("--ids", action="store_true", help="show the ids the model sampled")
    c.add_argument("--system", help="a system message")
    c.add_argument("--max-tokens", type=int, default=256)
    c.add_argument("--temperature", type=float, default=0.7)
    c.set_defaults(func=_chat)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from pydantic import ValidationError

    from .errors import TokenwireError

    args = _parser().parse_args(argv)
    try:
        return int(args.func(args))
    except _UsageError as exc:
        print(f"tokenwire {args.command}: {exc}", file=sys.stderr)
        return 2
    except (TokenwireError, ValidationError, ValueError) as exc:
        if not hasattr(args, "server"):
            raise
        # what a server (or a URL that is not one) answered: no traceback, the flag to fix
        why = str(exc) if getattr(args, "artifact", None) else _explain(exc, args)
        print(f"tokenwire {args.command}: {why}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

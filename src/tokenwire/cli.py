"""`tokenwire serve | tokenize | detokenize | chat`."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .config import Settings
    from .server.app import create_app

    overrides = {k: v for k, v in {
        "model": args.model, "host": args.host, "port": args.port,
        "served_model_name": args.served_model_name, "max_model_len": args.max_model_len,
        "n_parallel": args.n_parallel,
    }.items() if v is not None}
    settings = Settings(**overrides)
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level=settings.log_level, timeout_graceful_shutdown=30)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenwire", description="Token-native LLM API server.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve a GGUF chat model over the OpenAI-compatible API")
    s.add_argument("--model", type=Path, help="GGUF file (default: embedded SmolLM2-135M)")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.add_argument("--served-model-name")
    s.add_argument("--max-model-len", type=int)
    s.add_argument("--n-parallel", type=int)
    s.set_defaults(func=_serve)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())

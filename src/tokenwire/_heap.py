"""The server's heap: the C heap's free pages given back to the system, and the objects made at
start kept out of the garbage collector's way.

Loading a model parses its tokenizer (a GGUF's vocabulary and merges as Python objects, a
tokenizer.json twice over) and throws most of it away; glibc keeps those freed pages mapped, so
without a trim they stay in the server's resident memory for its whole life (~30 MB here).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

__all__ = ["freeze_heap", "thaw_heap", "trim_heap"]


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


def freeze_heap() -> None:
    """Move every object alive now (modules, registries, tokenizers: what start made) out of the
    collector's generations, as vLLM's server does after start (`freeze_gc_heap`): otherwise
    each full collection walks them again, on the event loop, and under a burst of whole
    answers those walks took up to 136 ms each (57 ms frozen; docs/hot-path.md). Call it
    right after `trim_heap`, whose collection leaves only live objects to freeze."""
    gc.freeze()


def thaw_heap() -> None:
    """Give the frozen objects back to the collector (at the app's end: what it held may now
    be garbage, and a process that starts another app must be able to free it)."""
    gc.unfreeze()

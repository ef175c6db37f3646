"""Token ids as bytes: little-endian unsigned integers, 2 bytes each when the vocabulary fits
in 16 bits (SmolLM2: 49,152 ids), else 4 (Gemma 3: 262,144). A row records the width it was
packed with, so a reader never has to know the vocabulary to unpack it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidTokenIdError

__all__ = ["pack", "unpack", "width_for"]

_DTYPES: dict[int, np.dtype[Any]] = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def width_for(vocab_size: int) -> int:
    """Bytes per id for a vocabulary of `vocab_size` ids (ids 0 .. vocab_size - 1)."""
    if not 0 < vocab_size <= 1 << 32:
        raise ValueError(f"a vocabulary of {vocab_size} ids cannot be packed")
    return 2 if vocab_size <= 1 << 16 else 4


def pack(ids: Sequence[int], vocab_size: int) -> tuple[bytes, int]:
    """`ids` as bytes and the width used; an id outside the vocabulary is refused rather than
    wrapped around."""
    width = width_for(vocab_size)
    # int64 holds every id a client can send (Python ints beyond it fail here, as out of range)
    try:
        arr = np.asarray(ids, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        arr = None
    if arr is None or arr.ndim != 1:
        raise InvalidTokenIdError(f"token ids must be integers below {vocab_size}")
    bad = np.flatnonzero((arr < 0) | (arr >= vocab_size))
    if bad.size:
        i = int(bad[0])
        raise InvalidTokenIdError(f"token id {int(arr[i])} at position {i} is outside the "
                                  f"vocabulary of {vocab_size} ids")
    return arr.astype(_DTYPES[width]).tobytes(), width


def unpack(data: bytes, width: int) -> list[int]:
    if width not in _DTYPES or len(data) % width:
        raise ValueError(f"{len(data)} bytes are not ids of {width} bytes")
    ids: list[int] = np.frombuffer(data, dtype=_DTYPES[width]).tolist()
    return ids

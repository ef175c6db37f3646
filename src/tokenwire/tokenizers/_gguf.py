"""A reader for the metadata section of a GGUF file (keys and values, not tensors).

The `gguf` package parses every tensor header too and takes seconds on a small model; the
tokenizer needs only the key/value section at the head of the file, which this reads in one
pass. Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import GGUFFormatError

__all__ = ["GGUFFormatError", "read_metadata"]

_SCALARS: dict[int, str] = {
    0: "B",  # uint8
    1: "b",  # int8
    2: "H",  # uint16
    3: "h",  # int16
    4: "I",  # uint32
    5: "i",  # int32
    6: "f",  # float32
    7: "?",  # bool
    10: "Q",  # uint64
    11: "q",  # int64
    12: "d",  # float64
}
_STRING = 8
_ARRAY = 9


class _Reader:
    def __init__(self, f: BinaryIO):
        self._f = f

    def take(self, n: int) -> bytes:
        data = self._f.read(n)
        if len(data) != n:
            raise GGUFFormatError("unexpected end of file in the metadata section")
        return data

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, self.take(size))[0]

    def string(self) -> str:
        n = self.scalar("Q")
        return self.take(n).decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type = self.scalar("I")
            count = self.scalar("Q")
            if item_type in _SCALARS:
                fmt = _SCALARS[item_type]
                size = struct.calcsize("<" + fmt)
                return list(struct.unpack(f"<{count}{fmt}", self.take(size * count)))
            return [self.value(item_type) for _ in range(count)]
        raise GGUFFormatError(f"unknown GGUF value type {vtype}")


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Every key/value pair of a GGUF file's header, in file order."""
    with open(path, "rb") as f:
        r = _Reader(f)
        if r.take(4) != b"GGUF":
            raise GGUFFormatError(f"{path} is not a GGUF file")
        version = r.scalar("I")
        if version < 2:
            raise GGUFFormatError(f"GGUF version {version} is not supported")
        r.scalar("Q")  # tensor count
        kv_count = r.scalar("Q")
        out: dict[str, Any] = {}
        for _ in range(kv_count):
            key = r.string()
            out[key] = r.value(r.scalar("I"))
        return out

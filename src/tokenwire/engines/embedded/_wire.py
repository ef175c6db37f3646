"""Frames between the HTTP processes and the engine process: a 4-byte length, then a pickle.

Both ends are tokenwire processes of one server, on a Unix socket in a run directory only its
user can enter (mkdtemp's 0700): pickle carries the engine's own dataclasses (`SamplingParams`,
`TokenEvent`, ...) with no schema of our own to keep in step, at a few microseconds a frame.
An error crosses as its status and OpenAI body (`Failure`), rebuilt as the same class.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from dataclasses import dataclass
from typing import Any

from ...errors import TokenwireError, error_from_body

__all__ = ["Failure", "frame", "read_frame"]

_HEADER = struct.Struct("!I")


@dataclass(frozen=True, slots=True)
class Failure:
    """A `TokenwireError` on the wire."""

    status: int
    body: dict[str, Any]

    @classmethod
    def of(cls, exc: TokenwireError) -> Failure:
        return cls(exc.status_code, exc.to_body())

    def error(self) -> TokenwireError:
        return error_from_body(self.status, self.body)


def frame(message: object) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message; `asyncio.IncompleteReadError` at the end of the stream."""
    (n,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    return pickle.loads(await reader.readexactly(n))

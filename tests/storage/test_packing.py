from __future__ import annotations

import pytest

from tokenwire.errors import InvalidTokenIdError
from tokenwire.storage._packing import pack, unpack, width_for

SMOLLM2_VOCAB = 49_152
GEMMA3_VOCAB = 262_144


@pytest.mark.parametrize(("vocab", "width"), [(1, 2), (SMOLLM2_VOCAB, 2), (65_536, 2),
                                              (65_537, 4), (GEMMA3_VOCAB, 4)])
def test_width_follows_the_vocabulary(vocab: int, width: int) -> None:
    assert width_for(vocab) == width


@pytest.mark.parametrize("vocab", [SMOLLM2_VOCAB, 65_536, GEMMA3_VOCAB])
def test_round_trip_at_the_edges(vocab: int) -> None:
    ids = [0, 1, vocab // 2, vocab - 1, 0, 255, 256]
    data, width = pack(ids, vocab)
    assert len(data) == width * len(ids)
    assert unpack(data, width) == ids


def test_two_bytes_little_endian() -> None:
    data, width = pack([1, 0x1234], SMOLLM2_VOCAB)
    assert (data, width) == (b"\x01\x00\x34\x12", 2)


def test_empty() -> None:
    assert pack([], SMOLLM2_VOCAB) == (b"", 2)
    assert unpack(b"", 4) == []


@pytest.mark.parametrize(("ids", "where"), [([5, SMOLLM2_VOCAB], "id 49152 at position 1"),
                                            ([-1], "id -1 at position 0"),
                                            ([1, 2, 1 << 70], "integers below")])
def test_ids_outside_the_vocabulary_are_refused(ids: list[int], where: str) -> None:
    with pytest.raises(InvalidTokenIdError, match=where):
        pack(ids, SMOLLM2_VOCAB)


def test_a_width_2_vocabulary_never_wraps_around() -> None:
    """65,536 would read back as 0 in 16 bits: refused, not stored."""
    with pytest.raises(InvalidTokenIdError):
        pack([65_536], 65_536)


@pytest.mark.parametrize(("data", "width"), [(b"\x00\x00\x00", 2), (b"\x00\x00", 3)])
def test_unpack_refuses_torn_bytes(data: bytes, width: int) -> None:
    with pytest.raises(ValueError):
        unpack(data, width)


def test_vocabulary_size_checked() -> None:
    with pytest.raises(ValueError):
        width_for(0)

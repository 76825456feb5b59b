"""The isolated scorer's frames: whatever bytes arrive, a reader gets a frame or a WireError."""

from __future__ import annotations

import io

import pytest
import torch

from kvbench.isolation import wire


def frame(header: bytes, payload: bytes) -> io.BytesIO:
    return io.BytesIO(wire.LENGTH.pack(len(header)) + header + wire.LENGTH.pack(len(payload)) + payload)


def test_a_frame_reads_back() -> None:
    header, tensors = wire.read(io.BytesIO(wire.encode({"op": "x"}, {"t": torch.arange(3)})), 1 << 20)
    assert header == {"op": "x"} and tensors["t"].tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "header, payload",
    [
        (b"{x}", b""),  # not JSON
        (b"[" * 100_000 + b"]" * 100_000, b""),  # JSON nested past the parser's recursion
        (b"{}", b"abcde"),  # not safetensors
        (b"[]", b""),  # not an object
    ],
    ids=["not json", "nested", "not safetensors", "not an object"],
)
def test_a_frame_not_in_the_format_is_a_wire_error(header: bytes, payload: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.read(frame(header, payload), 1 << 20)

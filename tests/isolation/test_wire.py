"""The isolated scorer's frames: whatever bytes arrive, a reader gets a frame or a WireError."""

from __future__ import annotations

import io
import json

import pytest
import torch

from kvbench.isolation import wire


def frame(header: bytes, payload: bytes) -> io.BytesIO:
    return io.BytesIO(wire.LENGTH.pack(len(header)) + header + wire.LENGTH.pack(len(payload)) + payload)


def test_a_frame_reads_back() -> None:
    header, tensors = wire.read(io.BytesIO(wire.encode({"op": "x"}, {"t": torch.arange(3)})), 1 << 20)
    assert header == {"op": "x"} and tensors["t"].tolist() == [0, 1, 2]


def test_every_dtype_and_shape_reads_back_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    sent = {str(d): (torch.randn(3, 5, generator=g) * 100).to(d) for d in wire.DTYPES.values()}
    sent |= {
        "strided": torch.randn(4, 6, generator=g)[:, ::2],
        "scalar": torch.tensor(2.5),
        "empty": torch.ones(0, 3),
    }
    _, got = wire.read(io.BytesIO(wire.encode({}, sent)), 1 << 20)
    assert set(got) == set(sent)
    for name, t in sent.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape and torch.equal(got[name], t), name


def _layout(**entries: tuple[str, list[int], int]) -> dict:
    return {n: {"dtype": d, "shape": s, "offset": o} for n, (d, s, o) in entries.items()}


@pytest.mark.parametrize(
    "header, payload",
    [
        (b"{x}", b""),  # not JSON
        (b"[" * 100_000 + b"]" * 100_000, b""),  # JSON nested past the parser's recursion
        (b"[[], {}]", b""),  # not an object
        (b"{}", b""),  # no layout
        (json.dumps([{}, _layout(t=("object", [1], 0))]).encode(), b"abcdefgh"),  # a dtype outside DTYPES
        (json.dumps([{}, _layout(t=("float32", [3], 0))]).encode(), b"abcdefgh"),  # past the payload's end
        (json.dumps([{}, _layout(t=("float32", [-1, 2], 0))]).encode(), b"abcdefgh"),  # a negative size
        (json.dumps([{}, _layout(t=("int32", [1], 2))]).encode(), b"abcdefgh"),  # not aligned
        (
            json.dumps([{}, _layout(a=("int32", [2], 0), b=("int16", [2], 4))]).encode(),
            b"abcdefgh",
        ),  # overlap
    ],
    ids=[
        *("not json", "nested", "not an object", "no layout", "dtype"),
        *("past the end", "negative", "unaligned", "overlap"),
    ],
)
def test_a_frame_not_in_the_format_is_a_wire_error(header: bytes, payload: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.read(frame(header, payload), 1 << 20)

"""One message between the parent and an isolated scorer: a JSON header and named tensors.

A frame is ``len(head) head len(payload) payload``, each length an 8-byte big-endian integer, so that a
reader knows what to expect before it reads. ``head`` is the JSON array ``[header, layout]``; the layout
gives each tensor's dtype, shape and offset in the payload, which holds their bytes and nothing else:
nothing a reader executes (no pickle on either side). The arena (kvbench.isolation.arena) lays out a
request's tensors the same way in a file both sides map, so one reader checks both: a dtype outside
DTYPES, a shape that is not a list of sizes, a tensor past the end or not aligned to its element size, or
two that overlap is a WireError.
"""

from __future__ import annotations

import itertools
import json
import math
import struct
from typing import Any, BinaryIO

import torch
from torch import Tensor

LENGTH = struct.Struct(">Q")
MAX_HEADER = 1 << 20
ALIGN = 64
_KNOWN = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16)
DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d for d in (*_KNOWN, torch.int8, torch.uint8, torch.bool)
}

Frame = tuple[dict[str, Any], dict[str, Tensor]]


class WireError(Exception):
    """A frame that is cut short, too large, or not in the format."""


def place(tensors: dict[str, Tensor]) -> tuple[dict[str, tuple[Tensor, int]], int]:
    """Each tensor with its offset, aligned, from 0; and the end of the last."""
    placed, end = {}, 0
    for name, t in tensors.items():
        placed[name] = (t, end)
        end += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return placed, end


def layout(placed: dict[str, tuple[Tensor, int]]) -> dict[str, Any]:
    """What a reader needs of each placed tensor: its dtype, shape and offset."""
    return {
        name: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "offset": offset}
        for name, (t, offset) in placed.items()
    }


def write_at(buffer: Any, placed: dict[str, tuple[Tensor, int]]) -> None:
    """Copy each tensor into ``buffer`` at its offset."""
    for t, offset in placed.values():
        if t.numel():
            torch.frombuffer(buffer, dtype=t.dtype, count=t.numel(), offset=offset).view(t.shape).copy_(t)


def tensors_at(data: Tensor, layout: Any) -> dict[str, Tensor]:
    """The tensors ``layout`` places in ``data`` (bytes, as a 1-D uint8 tensor), read in place; WireError
    for a layout not in the format, a tensor past the end, one not aligned to its element size, or two
    that overlap."""
    if not isinstance(layout, dict):
        raise WireError("a tensor layout that is not an object")
    spans, tensors = [], {}
    for name, entry in layout.items():
        try:
            dtype = DTYPES[entry["dtype"]]
            shape = [int(s) for s in entry["shape"]]
            offset = int(entry["offset"])
        except (KeyError, TypeError, ValueError):
            raise WireError(f"tensor {name!r}: not {{dtype, shape, offset}} of a known dtype") from None
        size = dtype.itemsize * math.prod(shape)
        if min(shape, default=0) < 0 or offset < 0 or offset + size > data.numel():
            raise WireError(f"tensor {name!r}: shape {shape} at offset {offset} ends past the data")
        if offset % dtype.itemsize:
            raise WireError(f"tensor {name!r}: offset {offset} is not a multiple of its element size")
        spans.append((offset, offset + size, name))
        tensors[name] = data[offset : offset + size].view(dtype).view(shape)
    spans.sort()
    for (_, end, first), (start, _, second) in itertools.pairwise(spans):
        if start < end:
            raise WireError(f"tensors {first!r} and {second!r} overlap")
    return tensors


def encode(header: dict[str, Any], tensors: dict[str, Tensor]) -> bytearray:
    placed, size = place({name: t.detach().to("cpu") for name, t in tensors.items()})
    head = json.dumps([header, layout(placed)]).encode()
    frame = bytearray(2 * LENGTH.size + len(head) + size)
    LENGTH.pack_into(frame, 0, len(head))
    frame[LENGTH.size : LENGTH.size + len(head)] = head
    LENGTH.pack_into(frame, LENGTH.size + len(head), size)
    write_at(memoryview(frame)[2 * LENGTH.size + len(head) :], placed)
    return frame


def write(stream: BinaryIO, header: dict[str, Any], tensors: dict[str, Tensor]) -> None:
    stream.write(encode(header, tensors))
    stream.flush()


def read(stream: Any, max_payload: int) -> Frame:
    """The next frame; WireError when the stream ends inside it, a length is over its cap, or its header
    or layout is not in the format."""
    head_length = _length(stream)
    if head_length > MAX_HEADER:
        raise WireError(f"a header of {head_length} bytes (at most {MAX_HEADER})")
    try:
        head = json.loads(_exactly(stream, head_length))
    except (ValueError, RecursionError) as exc:
        raise WireError(f"a header that is not JSON ({exc})") from None
    if not (isinstance(head, list) and len(head) == 2 and isinstance(head[0], dict)):
        raise WireError("a header that is not [a JSON object, a tensor layout]")
    payload_length = _length(stream)
    if payload_length > max_payload:
        raise WireError(
            f"a payload of {payload_length:,} bytes announced, over the bound of {max_payload:,} bytes "
            "stated before it was read"
        )
    # copied into memory torch owns: the reply's tensors outlive the frame (in the layer state), and hold
    # no Python buffer that freeing them would have to release
    data = _exactly(stream, payload_length)
    payload = torch.frombuffer(data, dtype=torch.uint8).clone() if data else torch.empty(0, dtype=torch.uint8)
    return head[0], tensors_at(payload, head[1])


def _length(stream: Any) -> int:
    return int(LENGTH.unpack(_exactly(stream, LENGTH.size))[0])


def _exactly(stream: Any, count: int) -> bytearray:
    """The next ``count`` bytes of ``stream``; WireError when it ends first."""
    data, done = bytearray(count), 0
    while done < count:
        chunk = stream.read(count - done)
        if not chunk:
            raise WireError(f"the stream ended after {done} of {count} bytes")
        data[done : done + len(chunk)] = chunk
        done += len(chunk)
    return data

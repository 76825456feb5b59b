"""One message between the parent and an isolated scorer: a JSON header and named tensors.

Tensors travel as safetensors bytes, which carry only dtypes, shapes and data: nothing a reader
executes (no pickle on either side). A frame is ``len(header) header len(payload) payload``, each
length an 8-byte big-endian integer, so that a reader knows what to expect before it reads.
"""

from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch import Tensor

LENGTH = struct.Struct(">Q")
MAX_HEADER = 1 << 20

Frame = tuple[dict[str, Any], dict[str, Tensor]]


class WireError(Exception):
    """A frame that is cut short, too large, or not in the format."""


def encode(header: dict[str, Any], tensors: dict[str, Tensor]) -> bytes:
    head = json.dumps(header).encode()
    cpu = {name: t.detach().to("cpu").contiguous().clone() for name, t in tensors.items()}
    payload = save_tensors(cpu) if cpu else b""
    return LENGTH.pack(len(head)) + head + LENGTH.pack(len(payload)) + payload


def write(stream: BinaryIO, header: dict[str, Any], tensors: dict[str, Tensor]) -> None:
    stream.write(encode(header, tensors))
    stream.flush()


def read(stream: Any, max_payload: int) -> Frame:
    """The next frame; WireError when the stream ends inside it, a length is over its cap, or its header
    or payload is not in the format."""
    head_length = _length(stream)
    if head_length > MAX_HEADER:
        raise WireError(f"a header of {head_length} bytes (at most {MAX_HEADER})")
    try:
        header = json.loads(_exactly(stream, head_length))
    except (ValueError, RecursionError) as exc:
        raise WireError(f"a header that is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise WireError("a header that is not a JSON object")
    payload_length = _length(stream)
    if payload_length > max_payload:
        raise WireError(f"a payload of {payload_length} bytes (at most {max_payload})")
    payload = _exactly(stream, payload_length)
    try:
        return header, (dict(load_tensors(payload)) if payload else {})
    except SafetensorError as exc:
        raise WireError(f"a payload that is not safetensors ({exc})") from None


def _length(stream: Any) -> int:
    return int(LENGTH.unpack(_exactly(stream, LENGTH.size))[0])


def _exactly(stream: Any, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = stream.read(count - len(data))
        if not chunk:
            raise WireError(f"the stream ended after {len(data)} of {count} bytes")
        data += chunk
    return bytes(data)

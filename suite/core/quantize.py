"""Per-token asymmetric n-bit quantization of cache vectors, packed into self-contained byte rows.

Each vector of D channels is cut into groups of ``group`` channels; each group becomes one row of
``group·bits/8`` code bytes followed by its scale and its offset (the group's minimum), the layout of
torch's row-wise quantized embedding ops (``torch.ops.quantized.embedding_bag_{2bit,4bit,byte}_prepack``,
fbgemm's fused n-bit rows): fp16 scale and offset for 2 and 4 bits, fp32 for 8. A row holds everything
needed to read it back, so cache slots can be gathered, moved and counted byte for byte.

On CPU those torch ops do the work. They have no CUDA kernels for packing, so on other devices the same
layout is written with tensor arithmetic (`_pack_with_tensor_ops`); the tests compare the two on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

BITS = (2, 4, 8)


@dataclass(frozen=True)
class RowQuantizer:
    bits: int
    group: int

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"quantization bits must be one of {BITS}, got {self.bits}")
        if self.group < 8 or self.group % 8:
            raise ValueError(f"the quantization group must be a multiple of 8 channels, got {self.group}")

    def row_bytes(self) -> int:
        """Bytes of one packed group: its codes, then its scale and offset."""
        return self.group * self.bits // 8 + 2 * _param_dtype(self.bits).itemsize

    def vector_bytes(self, dim: int) -> int:
        """Bytes of one packed vector of ``dim`` channels."""
        self.check_dim(dim)
        return dim // self.group * self.row_bytes()

    def check_dim(self, dim: int) -> None:
        if dim % self.group:
            raise ValueError(
                f"the quantization group of {self.group} channels does not divide the head dimension {dim}; "
                "choose a group size that does"
            )

    def pack(self, x: Tensor, *, tensor_ops: bool = False) -> Tensor:
        """x [..., D] -> uint8 [..., vector_bytes(D)]."""
        dim = x.shape[-1]
        self.check_dim(dim)
        rows = x.reshape(-1, self.group)
        if rows.device.type == "cpu" and not tensor_ops:
            packed = _PREPACK[self.bits](rows.float().contiguous())
        else:
            packed = _pack_with_tensor_ops(rows.float(), self.bits)
        return packed.reshape(*x.shape[:-1], self.vector_bytes(dim))

    def unpack(self, packed: Tensor, dtype: torch.dtype, *, tensor_ops: bool = False) -> Tensor:
        """uint8 [..., vector_bytes(D)] -> [..., D] in ``dtype``."""
        rows = packed.reshape(-1, self.row_bytes())
        if rows.device.type == "cpu" and not tensor_ops:
            values = _UNPACK[self.bits](rows.contiguous())
        else:
            values = _unpack_with_tensor_ops(rows, self.bits, self.group)
        dim = packed.shape[-1] // self.row_bytes() * self.group
        return values.reshape(*packed.shape[:-1], dim).to(dtype)


_PREPACK = {
    2: torch.ops.quantized.embedding_bag_2bit_prepack,
    4: torch.ops.quantized.embedding_bag_4bit_prepack,
    8: torch.ops.quantized.embedding_bag_byte_prepack,
}
_UNPACK = {
    2: torch.ops.quantized.embedding_bag_2bit_unpack,
    4: torch.ops.quantized.embedding_bag_4bit_unpack,
    8: torch.ops.quantized.embedding_bag_byte_unpack,
}


def _param_dtype(bits: int) -> torch.dtype:
    """A group's scale and offset are fp32 at 8 bits and fp16 below, as the prepack ops store them."""
    return torch.float32 if bits == 8 else torch.float16


def _shifts(bits: int, device: torch.device) -> Tensor:
    """The bit offsets of the 8 / bits codes that share a byte, lowest first."""
    return torch.arange(8 // bits, device=device, dtype=torch.uint8) * bits


def _pack_with_tensor_ops(rows: Tensor, bits: int) -> Tensor:
    """The prepack ops' rows [N, g] -> [N, g·bits/8 + params], for devices those ops do not run on."""
    levels = 2**bits - 1
    low, high = rows.amin(dim=-1, keepdim=True), rows.amax(dim=-1, keepdim=True)
    params = _param_dtype(bits)
    low = low.to(params).float()
    scale = ((high - low) / levels).to(params).float()
    if bits == 8:  # the byte op stores a flat group's zero scale and steps by levels / (range + 1e-8)
        codes = (rows - low) * (levels / (high - low + 1e-8))
    else:  # the n-bit ops store a zero scale as 1 and divide by it
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        codes = (rows - low) / scale
    codes = codes.round().clamp(0, levels).to(torch.uint8)
    shifts = _shifts(bits, rows.device)
    packed = (codes.view(len(rows), -1, len(shifts)) << shifts).sum(dim=-1, dtype=torch.uint8)
    tail = torch.cat([scale, low], dim=-1).to(params).contiguous().view(torch.uint8)
    return torch.cat([packed, tail], dim=-1)


def _unpack_with_tensor_ops(rows: Tensor, bits: int, group: int) -> Tensor:
    code_bytes, tail = rows[:, : group * bits // 8], rows[:, group * bits // 8 :]
    scale_low = tail.contiguous().view(_param_dtype(bits)).float()
    codes = (code_bytes.unsqueeze(-1) >> _shifts(bits, rows.device)) & (2**bits - 1)
    return codes.reshape(len(rows), group).float() * scale_low[:, :1] + scale_low[:, 1:]

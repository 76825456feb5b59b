"""One layer's mixed-precision cache: the same interface as LayerKV, in two stores.

Logical slot order is [quantized slots | full-precision slots]; each part is in position order, and the
full-precision part ends with the buffer (the newest tokens), so the engine's view of the cache — the
last B slots are the buffer — holds. Quantized slots are packed byte rows (kvbench.core.quantize) and
are dequantized on every read, so the cache never holds a second copy of them: its memory is what
``nbytes`` counts. Policy slot state follows the logical order.

At every event (``compacted``) the kept slots are re-split: the buffer and up to N_hp full-precision
candidates stay, chosen by the protocol's demotion rule; the other full-precision candidates are
quantized. Every KV head of a layer keeps the same number of high-precision tokens (the smallest number
any head can keep), so both stores stay rectangular.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from kvbench.core.contract import LayerState
from kvbench.core.layer_kv import LayerKV, _select_slots
from kvbench.core.precision import MixedPrecision

_NOT_CANDIDATE, _NOT_ADMITTED = -2, -1


class MixedLayerKV:
    def __init__(self, full: LayerKV, precision: MixedPrecision, buffer: int) -> None:
        batch, heads, _, dim = full.keys.shape
        self.full, self.precision, self.buffer = full, precision, buffer
        self.quantizer = precision.quantizer
        self.quantizer.check_dim(dim)
        self.dtype = full.keys.dtype
        empty = torch.empty(batch, heads, 0, self.quantizer.vector_bytes(dim), dtype=torch.uint8)
        self.packed_keys = self.packed_values = empty.to(full.keys.device)
        self.packed_positions = torch.empty(batch, heads, 0, dtype=torch.long, device=full.keys.device)
        self.members = 0
        """The first ``members`` full-precision slots are the high-precision set chosen at the last event."""
        self.state = full.state
        full.state = LayerState()  # slot state follows the logical order, which only this class knows

    @property
    def quantized(self) -> int:
        return self.packed_positions.shape[-1]

    @property
    def length(self) -> int:
        return self.quantized + self.full.length

    @property
    def keys(self) -> Tensor:
        """[B, Hkv, length, D]: the quantized slots dequantized, then the full-precision ones."""
        return self._read(self.packed_keys, self.full.keys)

    @property
    def values(self) -> Tensor:
        return self._read(self.packed_values, self.full.values)

    @property
    def positions(self) -> Tensor:
        return torch.cat([self.packed_positions, self.full.positions], dim=2)

    @property
    def nbytes(self) -> int:
        """Bytes of the live cache: packed rows (codes, scales, offsets), full-precision keys and values."""
        return self.packed_keys.nbytes + self.packed_values.nbytes + self.full.nbytes

    @property
    def high_precision(self) -> Tensor:
        """[B, Hkv, length] bool: which logical slots are held in the model's precision."""
        batch, heads = self.packed_positions.shape[:2]
        slots = torch.arange(self.length, device=self.packed_positions.device)
        return (slots >= self.quantized).expand(batch, heads, -1)

    def append(self, keys: Tensor, values: Tensor, positions: Tensor) -> None:
        self.full.append(keys, values, positions)
        self.state.append_slots(keys.shape[2])

    def select_rows(self, rows: Tensor) -> None:
        self.full.select_rows(rows)
        self.packed_keys = self.packed_keys.index_select(0, rows)
        self.packed_values = self.packed_values.index_select(0, rows)
        self.packed_positions = self.packed_positions.index_select(0, rows)
        self.state.select_rows(rows)

    def demotion_due(self) -> bool:
        return self.full.length - self.buffer > self.precision.high_precision

    def compacted(self, index: Tensor, headroom: int = 0, *, reuse: bool = False) -> MixedLayerKV:
        """Keep the logical slots ``index`` [B, Hkv, S'] (the buffer last), then demote as the rule says.
        A new MixedLayerKV whatever ``reuse`` says: demotion reads the old full-precision slots after the
        kept ones are gathered."""
        buffer = min(self.buffer, index.shape[-1])
        candidates, kept_buffer = (
            index[..., : index.shape[-1] - buffer],
            index[..., index.shape[-1] - buffer :],
        )
        in_full = candidates >= self.quantized
        keep_high = self._high_precision_choice(candidates, in_full)
        positions = self.positions
        quantized_slots = _in_position_order(_masked(candidates, ~keep_high), positions)
        high_slots = _in_position_order(_masked(candidates, keep_high), positions)

        new = copy.copy(self)  # precision, buffer, quantizer and dtype carry over; the stores are new
        new.full = self.full.compacted(
            torch.cat([high_slots, kept_buffer], dim=-1) - self.quantized, headroom
        )
        new.packed_keys = self._packed(quantized_slots, self.packed_keys, self.full.keys)
        new.packed_values = self._packed(quantized_slots, self.packed_values, self.full.values)
        new.packed_positions = torch.gather(positions, 2, quantized_slots)
        new.members = high_slots.shape[-1]
        new.state = self.state.gathered(torch.cat([quantized_slots, high_slots, kept_buffer], dim=-1))
        return new

    # -- internals --------------------------------------------------------------------------------
    def _read(self, packed: Tensor, full: Tensor) -> Tensor:
        if packed.shape[2] == 0:
            return full
        return torch.cat([self.quantizer.unpack(packed, self.dtype), full], dim=2)

    def _high_precision_choice(self, candidates: Tensor, in_full: Tensor) -> Tensor:
        """[B, Hkv, n] bool over ``candidates``: the full-precision ones that stay so."""
        keep = min(self.precision.high_precision, int(in_full.sum(dim=-1).min()) if in_full.numel() else 0)
        chosen = torch.zeros_like(in_full)
        if keep == 0:
            return chosen
        local = (candidates - self.quantized).clamp(min=0)
        values = self.full.values
        # compared at bf16 resolution: a repeated token's values differ only by float rounding (chunked
        # or token-by-token forwards), and their order must not hinge on it; ties go to the newer token
        ranges = (values.amax(dim=-1) - values.amin(dim=-1)).to(torch.bfloat16).float()
        ranges = torch.gather(ranges, 2, local).masked_fill(~in_full, float("-inf"))
        positions = torch.gather(self.full.positions, 2, local)
        if self.precision.demote == "smallest-range":
            newest_first = positions.argsort(dim=-1, descending=True)
            ranked = torch.gather(ranges, 2, newest_first).sort(dim=-1, descending=True, stable=True).indices
            return chosen.scatter_(-1, torch.gather(newest_first, 2, ranked[..., :keep]), True)
        member = in_full & (local < self.members)
        top = ranges.topk(keep, dim=-1).values[..., -1:]
        admitted = in_full & ~member & (ranges >= top)
        order = torch.full_like(positions, _NOT_ADMITTED).masked_fill(~in_full, _NOT_CANDIDATE)
        order = torch.where(member, positions, order)
        # newcomers outrank every member, so the members that make room are the oldest
        order = torch.where(admitted, positions + (1 << 40), order)
        return chosen.scatter_(-1, order.topk(keep, dim=-1).indices, True)

    def _packed(self, slots: Tensor, packed: Tensor, full: Tensor) -> Tensor:
        """Packed rows of logical ``slots``: copied when already quantized, quantized when demoted now."""
        batch, heads, count = slots.shape
        out = packed.new_empty(batch, heads, count, packed.shape[-1])
        old = slots < self.quantized
        if self.quantized:
            out[old] = _select_slots(packed, slots.clamp(max=self.quantized - 1))[old]
        demoted = ~old
        if demoted.any():
            rows = _select_slots(full, (slots - self.quantized).clamp(min=0))[demoted]
            out[demoted] = self.quantizer.pack(rows)
        return out


def _masked(slots: Tensor, mask: Tensor) -> Tensor:
    """The entries of ``slots`` [B, H, n] where ``mask``, in order; every (B, H) has the same count."""
    count = int(mask[0, 0].sum()) if mask.numel() else 0
    return slots[mask].view(*slots.shape[:2], count)


def _in_position_order(slots: Tensor, positions: Tensor) -> Tensor:
    order = torch.gather(positions, 2, slots).argsort(dim=-1)
    return torch.gather(slots, 2, order)


Slots = LayerKV | MixedLayerKV
"""What a backend keeps per layer: a plain or a mixed-precision cache, with the same interface."""

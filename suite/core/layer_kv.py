"""One layer's cache for a batch, in buffers with spare capacity so that appending never copies the past.

Slots are kept in cache order in ``[B, Hkv, capacity, D]`` buffers; the first ``length`` slots are live.
Appending writes in place while capacity lasts (growing geometrically when it does not). An eviction
compacts the kept slots: on the CPU, into the buffers the cache already owns (no allocation per event: a
fresh buffer of a batch's cache is tens of MiB, which the allocator maps anew at every event and the
kernel zeroes page by page, which cost twice the copy itself at batch 16); elsewhere into a new buffer
with room for the next B tokens. Either way an evicting cache's memory stays flat at K + B slots.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kvbench.core.contract import LayerState


class LayerKV:
    """Keys, values and positions of one layer's slots, plus the policy's per-layer state."""

    def __init__(
        self,
        keys: Tensor,
        values: Tensor,
        positions: Tensor,
        state: LayerState | None = None,
        *,
        capacity: int | None = None,
    ) -> None:
        """keys, values [B, Hkv, S, D]; positions [B, Hkv, S] (int64 absolute positions)."""
        self.length = keys.shape[2]
        self.state = state if state is not None else LayerState()
        self._keys, self._values, self._positions = keys, values, positions
        self._owned = False  # the caller's tensors: never overwritten by a compaction
        if capacity is not None and capacity > self.length:
            self.reserve(capacity)

    @classmethod
    def empty(
        cls,
        batch: int,
        heads: int,
        dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        capacity: int = 0,
    ) -> LayerKV:
        keys = torch.empty(batch, heads, 0, dim, dtype=dtype, device=device)
        positions = torch.empty(batch, heads, 0, dtype=torch.long, device=device)
        return cls(keys, keys.clone(), positions, capacity=capacity)

    @property
    def keys(self) -> Tensor:
        """[B, Hkv, length, D] (a view of the buffer)."""
        return self._keys[:, :, : self.length]

    @property
    def values(self) -> Tensor:
        return self._values[:, :, : self.length]

    @property
    def positions(self) -> Tensor:
        return self._positions[:, :, : self.length]

    @property
    def capacity(self) -> int:
        return self._keys.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes of the live keys and values (independent of how much spare capacity is allocated)."""
        per_slot = (self._keys.nbytes + self._values.nbytes) // max(self.capacity, 1)
        return per_slot * self.length

    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` slots without changing the live ones."""
        if capacity <= self.capacity:
            return
        self._keys = _grown(self._keys, capacity, self.length)
        self._values = _grown(self._values, capacity, self.length)
        self._positions = _grown(self._positions, capacity, self.length)
        self._owned = True

    def append(self, keys: Tensor, values: Tensor, positions: Tensor) -> None:
        """Append new slots ([B, Hkv, t, D] and [B, Hkv, t]) after the live ones."""
        count = keys.shape[2]
        end = self.length + count
        if end > self.capacity:
            self.reserve(max(end, 2 * self.capacity))
        self._keys[:, :, self.length : end] = keys
        self._values[:, :, self.length : end] = values
        self._positions[:, :, self.length : end] = positions
        self.length = end
        self.state.append_slots(count)

    def select_rows(self, rows: Tensor) -> None:
        """Keep only batch rows ``rows`` (1-D int64 index)."""
        self._keys = self._keys.index_select(0, rows)
        self._values = self._values.index_select(0, rows)
        self._positions = self._positions.index_select(0, rows)
        self._owned = True
        self.state.select_rows(rows)

    def compacted(self, index: Tensor, headroom: int = 0, *, reuse: bool = False) -> LayerKV:
        """The slots ``index`` [B, Hkv, S'], in that order, with room for ``headroom`` more.

        ``reuse``: the caller gives this LayerKV up, so its own buffers may take the result (itself is
        returned) when they are on the CPU, hold the headroom and ``index`` ascends in every row; else, and
        always without ``reuse``, a new LayerKV is returned and this one is left as it was."""
        if (
            reuse
            and self._owned
            and self._keys.device.type == "cpu"
            and not self._keys.requires_grad  # a cache filled outside no_grad: autograd's history stays
            and self._compacts_in_place(index, headroom)
        ):
            return self
        # The headroom slots are filled with copies of the first kept slot: one gather allocates the buffer
        # at its final size, and they are overwritten by the next appends before anyone reads them.
        padded = torch.cat([index, index[:, :, :1].expand(-1, -1, headroom)], dim=-1) if headroom else index
        new = LayerKV(
            _select_slots(self._keys, padded),
            _select_slots(self._values, padded),
            torch.gather(self._positions, 2, padded),
            self.state.gathered(index),
        )
        new.length = index.shape[-1]
        new._owned = True
        return new

    def _compacts_in_place(self, index: Tensor, headroom: int) -> bool:
        """Move the slots ``index`` to the front of their rows, in place, when that is safe: every row's
        index ascends, so slot i is read from slot index[i] >= i, at or after where it is written."""
        kept = index.shape[-1]
        if kept + headroom > self.capacity or not bool((index[..., 1:] > index[..., :-1]).all()):
            return False
        positions = torch.gather(self.positions, 2, index)
        self.state = self.state.gathered(index)
        # Row by row (one KV head of one batch row): its kept slots are read whole into a scratch row
        # before any is written, from its first slot that moves on (the slots before it stay put).
        rows = index.reshape(-1, kept)
        moves = rows != torch.arange(kept, device=index.device)
        first = torch.where(moves.any(-1), moves.int().argmax(-1), kept).tolist()
        for buffer in (self._keys, self._values):
            flat = buffer.view(-1, self.capacity, buffer.shape[-1])
            scratch = buffer.new_empty(kept, buffer.shape[-1])
            for row, start in enumerate(first):
                if start < kept:
                    moved = scratch[: kept - start]
                    torch.index_select(flat[row], 0, rows[row, start:], out=moved)
                    flat[row, start:kept].copy_(moved)
        self._positions[:, :, :kept] = positions
        self.length = kept
        return True


FIRST_RESERVE = 4096
"""Slots past the prompt that a cache which never evicts reserves first: it grows geometrically from there
rather than reserve a whole 32k-token reasoning trace that most samples never reach."""


def first_capacity(prompt_len: int, total_tokens: int, limit: int | None) -> int:
    """Slots one sequence's cache reserves before its prefill: ``limit``, the most an evicting cache ever
    holds, else the prompt and FIRST_RESERVE more (never past ``total_tokens``)."""
    return limit if limit is not None else min(total_tokens, prompt_len + FIRST_RESERVE)


def grown_capacity(capacity: int, needed: int) -> int:
    """The capacity a LayerKV reserved at ``capacity`` reaches once it holds ``needed`` slots, one token
    appended at a time: ``append`` doubles it whenever it runs out."""
    while capacity < needed:
        capacity = max(capacity + 1, 2 * capacity)
    return capacity


def _grown(buffer: Tensor, capacity: int, live: int) -> Tensor:
    bigger = buffer.new_empty((*buffer.shape[:2], capacity, *buffer.shape[3:]))
    bigger[:, :, :live] = buffer[:, :, :live]
    return bigger


def _select_slots(x: Tensor, index: Tensor) -> Tensor:
    """x [B, H, S, D] -> [B, H, S', D] at slot ``index`` [B, H, S'].

    An index_select of whole D-rows of the flattened cache: on CPU about 12x faster than torch.gather
    with an index expanded over D (measured with kvbench bench evict), since it copies contiguous rows.
    """
    batch, heads, slots, dim = x.shape
    row_base = torch.arange(batch * heads, device=index.device).view(batch, heads, 1) * slots
    rows = x.reshape(batch * heads * slots, dim).index_select(0, (index + row_base).reshape(-1))
    return rows.view(batch, heads, index.shape[-1], dim)

"""One request's slots in vLLM's paged KV cache: read them out dense, write compacted slots back.

vLLM 0.32 gives every attention layer one tensor whose logical shape is [num_blocks, Hkv, block_size, C]
(its physical stride order may differ; indexing follows the logical shape). Backends split C in one of
two ways, which is all this module needs to know:

- ``cpu`` (CPU_ATTN, its ``vec`` kernels): a (block, head) page holds block_size * D key elements, then
  as many value elements; values are [block_size, D] rows, keys are stored transposed, [D, block_size]
  (found by writing through the kernel's own cache-update op; the runner re-checks it at start-up);
- ``halves`` (FLASH_ATTN and the backends built like it): each slot's C = 2D holds its key, then its value.

Slot ``s`` of a request lives in block ``block_ids[s // block_size]`` at offset ``s % block_size``. Reading
and writing go through advanced indexing on [block, :, offset], so the same code serves any stride order,
and only the request's own blocks are ever touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

Content = Literal["cpu", "halves"]
CONTENT_OF_BACKEND: dict[str, Content] = {"CPU_ATTN": "cpu", "FLASH_ATTN": "halves"}
"""How each attention backend the adapter has been checked against splits a page; others are refused."""


def key_value_views(layer_cache: Tensor, content: Content) -> tuple[Tensor, Tensor]:
    """Keys and values of one layer's paged cache as [num_blocks, Hkv, block_size, D] views (no copy)."""
    blocks, heads, block_size, width = layer_cache.shape
    dim = width // 2
    if content == "cpu":
        page = layer_cache.view(blocks, heads, 2, block_size * dim)
        keys = page[:, :, 0].view(blocks, heads, dim, block_size).transpose(2, 3)
        return keys, page[:, :, 1].view(blocks, heads, block_size, dim)
    return layer_cache[..., :dim], layer_cache[..., dim:]


def slot_index(
    block_ids: Sequence[int], count: int, block_size: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """(block, offset) of a request's slots 0 .. count − 1."""
    slots = torch.arange(count, device=device)
    table = torch.as_tensor(list(block_ids), dtype=torch.long, device=device)
    return table[slots // block_size], slots % block_size


def read_slots(view: Tensor, blocks: Tensor, offsets: Tensor) -> Tensor:
    """[1, Hkv, n, D] copy of the slots at (blocks, offsets) of a [num_blocks, Hkv, block_size, D] view."""
    return view[blocks, :, offsets].permute(1, 0, 2).unsqueeze(0)


def write_slots(view: Tensor, blocks: Tensor, offsets: Tensor, dense: Tensor) -> None:
    """Write dense [1, Hkv, n, D] into the slots at (blocks, offsets)."""
    view[blocks, :, offsets] = dense[0].permute(1, 0, 2).to(view.dtype)

"""One request's eviction in paged memory: the engine's Evictor decides, this class only moves slots.

At an event the request's slots 0 .. n − 1 are read out of every layer into a LayerKV (with each KV
head's true token positions and the policy's slot state), the engine's :class:`Evictor` compacts them
exactly as it does for the hf backend, and the K kept slots are written back into the request's own
first K slots, in the order the engine left them (chronological by default). Slots K .. n − 1 are left
as they are: attention reads only up to the request's stored length, and the next tokens overwrite them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from kvbench.adapters.vllm.paged_kv import read_slots, slot_index, write_slots
from kvbench.adapters.vllm.paged_schedule import PagedSchedule
from kvbench.core.contract import LayerState
from kvbench.core.engine import Evictor
from kvbench.core.layer_kv import LayerKV


@dataclass
class RequestEviction:
    """The worker's record of one request: its evictor, and per layer the positions its slots hold."""

    evictor: Evictor
    paged: PagedSchedule
    num_layers: int
    kept_positions: list[Tensor | None] = field(default_factory=list)
    """Per layer, [1, Hkv, K] positions held by slots 0 .. K − 1 after the last event (None before one)."""
    states: list[LayerState] = field(default_factory=list)
    evicted_at: int = 0
    """The logical length at the last event (0 before one)."""
    seconds_select: float = 0.0
    """In the engine: scores, protection and top-k (with its dense compaction of the K kept slots)."""
    seconds_move: float = 0.0
    """Reading the slots out of the pages and writing the kept ones back."""

    def __post_init__(self) -> None:
        self.kept_positions = [None] * self.num_layers
        self.states = [LayerState() for _ in range(self.num_layers)]

    @property
    def events(self) -> int:
        return self.evictor.stats.events

    def report(self) -> dict[str, Any]:
        """What the backend reads of the request: its events, the seconds of each part, and what its KV
        heads kept at the last event (kvbench.core.retention's fields; None before one). Plain numbers and
        lists, which any of vLLM's RPC encodings carries."""
        log = self.evictor.retention
        kept = log.row(0) if log is not None else None
        return {
            "events": self.events,
            "seconds_select": self.seconds_select,
            "seconds_move": self.seconds_move,
            "retention": asdict(kept) if kept is not None else None,
        }

    def positions(self, layer: int, stored: int, length: int, heads: int, device: torch.device) -> Tensor:
        """[1, Hkv, stored] positions of the slots: the kept ones, then the tokens written since."""
        kept = self.kept_positions[layer]
        since = stored - (kept.shape[-1] if kept is not None else 0)
        fresh = torch.arange(length - since, length, device=device).expand(1, heads, since)
        return fresh if kept is None else torch.cat([kept, fresh], dim=-1)

    def evict(
        self,
        views: Sequence[tuple[Tensor, Tensor]],
        block_ids: Sequence[int],
        *,
        length: int,
        block_size: int,
        queries: Sequence[Tensor | None] | None,
    ) -> None:
        """Run the event due at logical ``length`` on every layer of the request's paged cache.

        ``views[l]`` are layer l's key and value views [num_blocks, Hkv, block_size, D].
        """
        started = time.perf_counter()
        stored = self.paged.first_event if self.evicted_at == 0 else self.paged.budget + self.paged.buffer
        device = views[0][0].device
        heads = views[0][0].shape[1]
        blocks, offsets = slot_index(block_ids, stored, block_size, device)
        layers = []
        for layer, (keys, values) in enumerate(views):
            state = self.states[layer]
            kept = self.kept_positions[layer]
            state.append_slots(stored - (kept.shape[-1] if kept is not None else 0))
            layers.append(
                LayerKV(
                    read_slots(keys, blocks, offsets),
                    read_slots(values, blocks, offsets),
                    self.positions(layer, stored, length, heads, device),
                    state,
                )
            )
        read = time.perf_counter()
        chosen = self.evictor.evict(layers, step=length, queries=queries)
        selected = time.perf_counter()
        budget = self.paged.budget
        blocks, offsets = blocks[:budget], offsets[:budget]
        for layer, ((keys, values), kv) in enumerate(zip(views, chosen, strict=True)):
            write_slots(keys, blocks, offsets, kv.keys)
            write_slots(values, blocks, offsets, kv.values)
            self.kept_positions[layer] = kv.positions.clone()
            self.states[layer] = kv.state
        self.evicted_at = length
        self.seconds_select += selected - read
        self.seconds_move += (read - started) + (time.perf_counter() - selected)

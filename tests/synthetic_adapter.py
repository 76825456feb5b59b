"""A backend without a model: random keys, values and queries drive the engine exactly as a model would.

It rotates random pre-RoPE keys and queries with real RoPE, keeps a window of recent queries, gives
``observe`` real softmax attention, appends one token per step and evicts when the schedule says so.
The engine's tests run on it; the transformers backend replaces it with a real model. It lives in tests/
(not in kvbench.adapters) because nothing a user installs runs it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from kvbench.core.contract import ModelFacts, Policy
from kvbench.core.engine import Evictor, PinnedSlots
from kvbench.core.layer_kv import LayerKV
from kvbench.core.mixed_kv import Slots
from kvbench.core.rope import apply_rope, rope_inv_freq
from kvbench.core.schedule import Schedule
from kvbench.core.seeding import generator, stable_seed


def synthetic_model(layers: int = 2, q_heads: int = 8, kv_heads: int = 2, head_dim: int = 16) -> ModelFacts:
    return ModelFacts(
        name=f"synthetic-{layers}x{q_heads}q{kv_heads}kv{head_dim}d",
        num_layers=layers,
        num_q_heads=q_heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope_inv_freq=rope_inv_freq(head_dim).float(),
    )


@dataclass
class StepRecord:
    """What happened at one step: the sequence length before eviction and whether an event fired."""

    step: int
    evicted: bool


class SyntheticBackend:
    """Runs ``policy`` under ``schedule`` on random tensors for a batch of ``len(row_seeds)`` rows."""

    def __init__(
        self,
        policy: Policy,
        schedule: Schedule,
        model: ModelFacts,
        *,
        prompt_len: int,
        row_seeds: Sequence[int],
        seed: int = 0,
        calibration: object = None,
        pinned: PinnedSlots | None = None,
        dtype: torch.dtype = torch.float32,
        query_window: int = 64,
    ) -> None:
        self.model = model
        self.policy = policy
        self.schedule = schedule
        self.dtype = dtype
        self.batch = len(row_seeds)
        self.window = max(query_window, policy.query_window, 1)
        self.evictor = Evictor(
            policy,
            schedule,
            model,
            prompt_len=prompt_len,
            row_seeds=row_seeds,
            calibration=calibration,
            pinned=pinned,
        )
        self.gen = generator(stable_seed("synthetic", seed))
        self.seen = 0
        self.layers: list[Slots] = []
        self.queries: list[Tensor] = []  # per layer [B, Hq, W, D], post-RoPE
        self._prefill(prompt_len)

    def _draw(self, heads: int, tokens: int) -> Tensor:
        shape = (self.batch, heads, tokens, self.model.head_dim)
        return torch.randn(shape, generator=self.gen, dtype=torch.float32).to(self.dtype)

    def _new_tokens(self, count: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Post-RoPE keys, values, positions [B, Hkv, t] and post-RoPE queries for ``count`` new tokens."""
        m = self.model
        pos = torch.arange(self.seen, self.seen + count)
        kv_pos = pos.expand(self.batch, m.num_kv_heads, count)
        keys = apply_rope(self._draw(m.num_kv_heads, count), kv_pos, m.rope_inv_freq)
        queries = apply_rope(
            self._draw(m.num_q_heads, count), pos.expand(self.batch, m.num_q_heads, count), m.rope_inv_freq
        )
        return keys, self._draw(m.num_kv_heads, count), kv_pos.clone(), queries

    def _attend(self, layer: int, queries: Tensor) -> None:
        """Causal softmax attention of the new queries over the layer's cache, handed to ``observe``."""
        kv = self.layers[layer]
        group = self.model.group
        keys = kv.keys.float().repeat_interleave(group, dim=1)  # [B, Hq, S, D]
        logits = queries.float() @ keys.transpose(-1, -2) / math.sqrt(self.model.head_dim)  # [B, Hq, q, S]
        q_pos = torch.arange(self.seen - queries.shape[2], self.seen)
        key_pos = kv.positions.repeat_interleave(group, dim=1)  # [B, Hq, S]
        future = key_pos.unsqueeze(2) > q_pos.view(1, 1, -1, 1)
        probs = logits.masked_fill(future, float("-inf")).softmax(dim=-1)
        self.evictor.observe(layer, kv, probs, self.seen)

    def _prefill(self, count: int) -> None:
        prompt_queries = []
        for _ in range(self.model.num_layers):
            keys, values, positions, queries = self._new_tokens(count)
            self.layers.append(LayerKV(keys, values, positions))
            prompt_queries.append(queries)
            self.queries.append(queries[:, :, -self.window :])
        self.seen = count
        for layer, queries in enumerate(prompt_queries):
            self._attend(layer, queries)

    def step(self) -> StepRecord:
        """Decode one token in every layer; evict if the schedule says so."""
        for layer, kv in enumerate(self.layers):
            keys, values, positions, queries = self._new_tokens(1)
            kv.append(keys, values, positions)
            self.queries[layer] = torch.cat([self.queries[layer], queries], dim=2)[:, :, -self.window :]
        self.seen += 1
        for layer in range(self.model.num_layers):
            self._attend(layer, self.queries[layer][:, :, -1:])
        evicted = self.evictor.due(self.layers[0].length)
        if evicted:
            self.layers = self.evictor.evict(self.layers, step=self.seen, queries=self.queries)
        return StepRecord(step=self.seen, evicted=evicted)

    def select_rows(self, rows: Sequence[int]) -> None:
        index = torch.tensor(list(rows), dtype=torch.long)
        for kv in self.layers:
            kv.select_rows(index)
        self.queries = [q.index_select(0, index) for q in self.queries]
        self.evictor.select_rows(rows)
        self.batch = len(rows)

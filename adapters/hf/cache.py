"""An evicting transformers Cache: per-layer slots in kvbench's LayerKV, evicted by the engine's schedule.

transformers asks a cache three things: ``update`` (append this step's keys and values, return what to
attend to), ``get_seq_length`` (how many tokens were seen: RoPE positions keep counting after eviction)
and ``get_mask_sizes`` / ``get_query_offset`` (how many slots are stored, which sizes the causal mask of
a multi-token forward). Getting the last two wrong raises nothing under sdpa; the tests compare against
full-cache outputs to catch it.

Under a mixed-precision protocol each layer is a MixedLayerKV, and at every event moment of the schedule
the cache demotes tokens to the protocol's bits, whether or not the policy evicts then.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from kvbench.adapters.base import KVBudget
from kvbench.core.contract import Policy
from kvbench.core.engine import Evictor, PinnedSlots
from kvbench.core.layer_kv import LayerKV, first_capacity
from kvbench.core.mixed_kv import MixedLayerKV, Slots
from kvbench.core.precision import TokenCost, footprint
from kvbench.core.schedule import Schedule
from kvbench.errors import CapabilityError


class EvictingLayer(CacheLayerMixin):
    """One decoder layer's slots. The engine, not this class, decides what to evict."""

    is_compileable = False
    is_sliding = False

    def __init__(self, capacity: int, schedule: Schedule) -> None:
        super().__init__()
        self.capacity = capacity
        self.schedule = schedule
        self.kv: Slots | None = None
        self.seen = 0

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        batch, heads, _, dim = key_states.shape
        kv = LayerKV.empty(
            batch, heads, dim, dtype=key_states.dtype, device=key_states.device, capacity=self.capacity
        )
        precision = self.schedule.precision
        self.kv = kv if precision is None else MixedLayerKV(kv, precision, self.schedule.buffer)
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        batch, heads, count, _ = key_states.shape
        positions = torch.arange(self.seen, self.seen + count, device=key_states.device)
        self.slots.append(key_states, value_states, positions.expand(batch, heads, count))
        self.seen += count
        return self.slots.keys, self.slots.values

    @property
    def slots(self) -> Slots:
        """The layer's slots, created by its first update."""
        if self.kv is None:
            raise RuntimeError("a cache layer has no slots before its first update")
        return self.kv

    @property
    def stored(self) -> int:
        return self.kv.length if self.kv is not None else 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.stored + query_length, 0

    def get_max_length(self) -> int:
        return -1


class EvictingCache(Cache):
    """The cache of one batch of samples sharing a prompt, evicting with ``evictor`` after each forward.

    Pass it to the model as ``cache=`` and as ``kvbench_cache=`` (the second reaches kvbench's attention
    functions, which record the queries the policy needs).
    """

    def __init__(self, evictor: Evictor, *, capacity: int, query_window: int) -> None:
        layers = evictor.model.num_layers
        super().__init__(layers=[EvictingLayer(capacity, evictor.schedule) for _ in range(layers)])
        self.evictor = evictor
        self.schedule = evictor.schedule
        self.query_window = query_window
        self.queries: list[Tensor | None] = [None] * layers
        self.observes_attention = "step_attention" in evictor.policy.needs
        self.peak_bytes = 0
        self.budget: KVBudget | None = None
        """What the schedule's budget holds and costs, set by make_cache."""

    @property
    def evicting_layers(self) -> list[EvictingLayer]:
        """``layers``, as the class that built them (transformers types them as its base class)."""
        return cast(list[EvictingLayer], self.layers)

    # -- called from the attention functions ------------------------------------------------------
    def record_queries(self, layer: int, query: Tensor) -> None:
        """Keep the layer's last W post-RoPE queries [B, Hq, W, D]."""
        if self.query_window == 0:
            return
        previous = self.queries[layer]
        recent = query if previous is None else torch.cat([previous, query], dim=2)
        self.queries[layer] = recent[:, :, -self.query_window :]

    def observe_attention(self, layer: int, probs: Tensor) -> None:
        kv = self.evicting_layers[layer].slots
        self.evictor.observe(layer, kv, probs, self.evicting_layers[layer].seen)

    # -- called by the decode loop ----------------------------------------------------------------
    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.evicting_layers[layer_idx].stored

    @property
    def seen(self) -> int:
        return self.evicting_layers[0].seen

    @property
    def stored(self) -> int:
        return self.evicting_layers[0].stored

    def kv_bytes(self) -> int:
        return sum(layer.kv.nbytes for layer in self.evicting_layers if layer.kv is not None)

    def evict_if_due(self) -> bool:
        """Run one eviction event on every layer if the schedule says so (and, under mixed precision,
        demote on every event moment); track peak KV memory. True when the policy evicted."""
        self.peak_bytes = max(self.peak_bytes, self.kv_bytes())
        if self.evictor.due(self.stored):
            compacted = self.evictor.evict(
                [layer.slots for layer in self.evicting_layers], step=self.seen, queries=self.queries
            )
            for layer, kv in zip(self.evicting_layers, compacted, strict=True):
                layer.kv = kv
            return True
        if self.schedule.precision is not None and self.schedule.on_phase(self.stored):
            for layer in self.evicting_layers:
                kv = layer.slots
                if isinstance(kv, MixedLayerKV) and kv.demotion_due():
                    batch, heads = kv.full.positions.shape[:2]
                    every = torch.arange(kv.length, device=kv.full.positions.device).expand(batch, heads, -1)
                    layer.kv = kv.compacted(every, self.schedule.buffer)
        return False

    def tokens_until_due(self) -> int:
        """Tokens a multi-token forward may feed before the cache's next event moment (teacher forcing
        cuts its chunks there, so that every event fires where token-by-token decoding fires it)."""
        if self.schedule.precision is not None:
            return self.schedule.tokens_until_phase(self.stored)
        if self.evictor.policy.evicts:
            return self.schedule.tokens_until_due(self.stored)
        return 1 << 62

    def repeat_prompt_row(self, samples: int) -> None:
        """After a one-row prefill, give each of the ``samples`` rows its own copy of the prompt's slots."""
        self._take_rows([0] * samples)

    def select_rows(self, rows: Sequence[int]) -> None:
        """Keep only batch rows ``rows`` (the others finished); their eviction seeds stay theirs."""
        self._take_rows(rows)
        self.evictor.select_rows(rows)

    def batch_select_indices(self, indices: Tensor) -> None:
        self.select_rows(indices.tolist())

    def _take_rows(self, rows: Sequence[int]) -> None:
        index = torch.tensor(list(rows), dtype=torch.long, device=self.evicting_layers[0].slots.keys.device)
        for layer in self.evicting_layers:
            layer.slots.select_rows(index)
        self.queries = [q.index_select(0, index) if q is not None else None for q in self.queries]


def cache_argument(model: Any, cache: EvictingCache) -> dict[str, Any]:
    """The forward's keyword arguments that hand it ``cache``: ``cache=`` from transformers 5.20 on,
    ``past_key_values=`` before (the GPU node's 5.17), and ``kvbench_cache=`` for kvbench's attention."""
    kind = type(model)
    if kind not in _CACHE_KEYWORDS:
        accepts = "cache" in inspect.signature(kind.forward).parameters
        _CACHE_KEYWORDS[kind] = "cache" if accepts else "past_key_values"
    return {_CACHE_KEYWORDS[kind]: cache, "kvbench_cache": cache}


_CACHE_KEYWORDS: dict[type, str] = {}
"""The cache keyword per model class, read once from its forward's signature."""


def make_cache(
    loaded: Any,
    policy: Policy,
    schedule: Schedule,
    *,
    prompt_len: int,
    row_seeds: Sequence[int],
    total_tokens: int,
    calibration: Any = None,
    refuse_capped_prompt: bool = False,
    pinned: PinnedSlots | None = None,
) -> EvictingCache:
    """An evicting cache sized for ``total_tokens`` (prompt + output) under ``policy``.

    A byte budget becomes tokens here, where the model's head dimension and dtype are known.
    """
    cost = TokenCost.of(loaded.facts.head_dim, loaded.model.dtype.itemsize, schedule.precision)
    schedule = schedule.in_tokens(cost)
    evictor = Evictor(
        policy,
        schedule,
        loaded.facts,
        prompt_len=prompt_len,
        row_seeds=row_seeds,
        calibration=calibration,
        pinned=pinned,
    )
    if refuse_capped_prompt and policy.evicts:
        schedule.refuse_capped(prompt_len)
    recorded = policy.needs & {"queries", "step_attention"}
    if recorded and not str(loaded.model.config._attn_implementation).startswith("kvbench_"):
        raise CapabilityError(
            f"policy {policy.name!r} needs {', '.join(sorted(recorded))}, which only kvbench's attention "
            f"functions record; the model runs {loaded.model.config._attn_implementation!r}: load it with "
            "kvbench.adapters.hf.models.load_model"
        )
    # An evicting cache reserves the most it will hold; a full one its prompt and 4096 more, then grows
    evicting = policy.evicts and total_tokens > schedule.budget
    capacity = first_capacity(prompt_len, total_tokens, schedule.most_slots(prompt_len) if evicting else None)
    window = max(policy.query_window, 1) if "queries" in policy.needs else 0
    cache = EvictingCache(evictor, capacity=capacity, query_window=window)
    per_head = footprint(schedule.budget, schedule.buffer, cost, schedule.precision)
    cache.budget = KVBudget(
        tokens=schedule.budget,
        bytes=per_head * loaded.facts.num_layers * loaded.facts.num_kv_heads,
    )
    return cache

"""A run's device memory, planned before its first token: the weights, each arm's cache and the
activations against the device, and the micro-batches a problem's samples decode in when they do not all
fit at once.

The plan follows what the hf adapter allocates (kvbench.core.layer_kv, adapters/hf/cache.py, decode.py):

- weights: every parameter once × the dtype's bytes;
- one sample's cache, per layer: slots × Hkv × (2 · D · dtype bytes for a key and a value, + 8 for the
  slot's int64 position). An evicting arm holds K + B slots (the prompt and B more while a prompt longer
  than K waits for its first event); the full cache reserves the prompt and 4096 more and doubles from
  there, so its slots are the capacity that doubling reaches at prompt + max new tokens. An eviction event
  holds every layer's cache and its compacted copy at once, beside every layer's fp32 scores; the full
  cache, when it grows or drops a finished row, copies one layer at a time. A policy that reads recent
  queries keeps its window of them per layer;
- activations: the larger of the prefill (one row of P prompt tokens: the MLP's three [P, intermediate]
  tensors, a few [P, hidden] ones and the queries, keys and values, in the model's dtype; attention's
  scores and probabilities [Hq, P, P] in fp32, as a kernel that does not tile holds them) and one decode
  step of b rows (the sampler's fp32 logits with top-p's sorted copy, its int64 indices and cumulative
  sums, about 40 bytes per vocabulary entry; attention's fp32 scores and probabilities [Hq, S]; a policy
  that reads every step's attention, or eager attention, also repeats the keys and values to every query
  head in fp32);
- a fixed reserve of 1 GiB for what torch does not report ahead: cuBLAS workspaces and the caching
  allocator's fragmentation.

A problem's samples split into micro-batches of at most ``--max-batch`` and of as many as the device holds;
each sample's sampling and eviction draws come from its own seed, so the rows are the same however the
samples are split (tests/runner/test_memory.py). The split is a run setting, never part of an identity.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.filesize import decimal

from kvbench.adapters.base import ModelShape
from kvbench.core.layer_kv import first_capacity, grown_capacity
from kvbench.core.precision import TokenCost
from kvbench.errors import BudgetError
from kvbench.runner.cell import Cell

RESERVE = 1 << 30
"""Bytes kept free for cuBLAS workspaces and the caching allocator's fragmentation."""
LOGIT_BYTES = 40
"""Bytes per vocabulary entry of one row's sampling step: fp32 logits, the temperature's and top-p's fp32
copies, top-p's sorted values, int64 indices, cumulative sums and masks, and the probabilities."""
POSITION_BYTES = 8
"""A cached slot's int64 position, kept per KV head beside its key and value."""


@dataclass(frozen=True)
class MemoryLimits:
    """What bounds a micro-batch: run settings (recorded in each run's manifest), never identity."""

    max_batch: int | None = None
    """At most this many samples of a problem decode at once (``--max-batch``)."""
    device_memory: int | None = None
    """Bytes the plan may fill (``--gpu-memory``); None: the device's free memory on CUDA, no limit
    on CPU."""
    source: str = ""
    """How ``device_memory`` was given, for the printed plan (``--gpu-memory 80GB``)."""


@dataclass(frozen=True)
class DeviceFacts:
    """What an executor knows where its units run: the plan's inputs besides the cells."""

    shape: ModelShape | None
    """None: the adapter does not report one (vllm plans its own memory); no plan then."""
    device: str
    free: int | None
    """Bytes free on the device before the model loaded (CUDA); None elsewhere."""
    prompt_tokens: dict[str, int]
    """The longest prompt of each generation cell, by run id."""


@dataclass(frozen=True)
class ArmPlan:
    """One arm (cell) of the plan."""

    label: str
    run_id: str
    prompt_tokens: int
    max_new_tokens: int
    budget: int | None
    """K in tokens; None for a cache that never evicts (the full cache, or K above every sequence)."""
    slots: int
    """Slots per layer and KV head that one sample's cache reaches."""
    cache_bytes: int
    """One sample's cache at its peak (an eviction event's copy, scores and recorded queries included)."""
    samples: int
    batch: int
    """Samples decoded at once."""
    batches: int
    """Micro-batches per problem."""
    activations: int
    """At ``batch`` rows."""
    total: int
    """Weights + batch × cache + activations + the reserve."""
    note: str = ""

    def record(self) -> dict[str, Any]:
        """What a run's manifest keeps of its plan."""
        return {
            "batch": self.batch,
            "batches": self.batches,
            "samples": self.samples,
            "cache_bytes_per_sample": self.cache_bytes,
            "planned_bytes": self.total,
        }


@dataclass(frozen=True)
class MemoryPlan:
    shape: ModelShape
    device: int | None
    """The bytes the plan may fill; None: no limit (CPU without --gpu-memory)."""
    device_source: str
    max_batch: int | None
    arms: tuple[ArmPlan, ...]

    @property
    def limited(self) -> bool:
        """Whether anything bounds a micro-batch (else every problem's samples decode at once)."""
        return self.device is not None or self.max_batch is not None

    def arm(self, run_id: str) -> ArmPlan | None:
        return next((arm for arm in self.arms if arm.run_id == run_id), None)


def micro_batches(samples: int, batch: int | None) -> list[range]:
    """Sample indices in micro-batches of at most ``batch`` (None: one batch), as even as they can be."""
    count = 1 if batch is None else math.ceil(samples / batch)
    bounds = [samples * i // count for i in range(count + 1)]
    return [range(start, end) for start, end in itertools.pairwise(bounds)]


def free_memory(device: str) -> int | None:
    """Bytes free on a CUDA ``device`` now (cached blocks of this process released first); None off CUDA."""
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None  # loading the model refuses the device with the fix
    torch.cuda.empty_cache()
    return int(torch.cuda.mem_get_info(torch.device(device))[0])


def slot_bytes(shape: ModelShape) -> int:
    """One cached slot in one layer, all KV heads: key, value and position."""
    return shape.kv_heads * (2 * shape.head_dim * shape.dtype_bytes + POSITION_BYTES)


def cache_slots(cell: Cell, shape: ModelShape, prompt: int, max_new: int) -> tuple[int, int | None]:
    """(slots per layer and KV head that one sample's cache reaches, K in tokens or None where the cache
    never evicts), by the rules the cache reserves and grows with."""
    total = prompt + max_new
    if cell.policy.evicts and cell.budget > cell.protocol.buffer:
        schedule = cell.schedule()
        precision = schedule.precision
        schedule = schedule.in_tokens(TokenCost.of(shape.head_dim, shape.dtype_bytes, precision))
        if total > schedule.budget:
            return schedule.most_slots(prompt), schedule.budget
    return grown_capacity(first_capacity(prompt, total, None), total), None


def sample_bytes(cell: Cell, shape: ModelShape, slots: int, evicting: bool) -> int:
    """One sample's cache at its peak."""
    layer = slots * slot_bytes(shape)
    if evicting:  # an event: every layer's cache and compacted copy, and its scores and ranked scores
        cache = 2 * shape.layers * layer + shape.layers * shape.kv_heads * slots * 4 * 2
    else:  # growing, or dropping a finished row: one layer's old and new buffers side by side
        cache = (shape.layers + 1) * layer
    if "queries" in cell.policy.needs:
        window = max(cell.policy.query_window, 1)
        cache += shape.layers * shape.q_heads * window * shape.head_dim * shape.dtype_bytes
    return cache


def activations(shape: ModelShape, rows: int, slots: int, prompt: int, attention_weights: bool) -> int:
    """The larger of the prefill's temporaries (one row) and a decode step's (``rows`` rows)."""
    width = 3 * shape.intermediate + 6 * shape.hidden  # the MLP's gate, up and product; the residual stream
    decode = rows * (shape.vocab * LOGIT_BYTES + shape.q_heads * slots * 4 * 2 + width * shape.dtype_bytes)
    qkv = (shape.q_heads + 2 * shape.kv_heads) * shape.head_dim
    prefill = prompt * (width + qkv) * shape.dtype_bytes + shape.q_heads * prompt * prompt * 4 * 2
    if attention_weights:  # keys and values repeated to every query head, in fp32
        decode += rows * shape.q_heads * slots * shape.head_dim * 4 * 2
        prefill += shape.q_heads * prompt * shape.head_dim * 4 * 2
    return max(decode, prefill)


@dataclass(frozen=True)
class _Need:
    """What one cell needs, as a function of its micro-batch."""

    cell: Cell
    shape: ModelShape
    prompt: int
    max_new: int

    @property
    def slots(self) -> tuple[int, int | None]:
        return cache_slots(self.cell, self.shape, self.prompt, self.max_new)

    @property
    def per_sample(self) -> int:
        slots, budget = self.slots
        return sample_bytes(self.cell, self.shape, slots, budget is not None)

    def activations(self, rows: int) -> int:
        weights = "step_attention" in self.cell.policy.needs or self.cell.runtime.attention == "eager"
        return activations(self.shape, rows, self.slots[0], self.prompt, weights)

    def total(self, rows: int) -> int:
        return self.shape.weight_bytes + rows * self.per_sample + self.activations(rows) + RESERVE

    def with_tokens(self, max_new: int) -> _Need:
        return _Need(self.cell, self.shape, self.prompt, max_new)


def plan_memory(cells: Sequence[Cell], facts: DeviceFacts, limits: MemoryLimits) -> MemoryPlan | None:
    """The micro-batch of every generation cell among ``cells`` (its budget known), or None without a
    model shape. Raises BudgetError naming every arm of which even one sample does not fit."""
    shape = facts.shape
    if shape is None:
        return None
    device, source = limits.device_memory, limits.source
    if device is None and facts.free is not None:
        device, source = facts.free, f"free on {facts.device} before the model loaded"
    arms, refused = [], []
    for cell in cells:
        if cell.run_id not in facts.prompt_tokens:
            continue  # teacher-forced: one pass over a fixed text, not planned
        need = _Need(cell, shape, facts.prompt_tokens[cell.run_id], cell.task.max_new_tokens)
        cap = min(cell.samples, limits.max_batch or cell.samples)
        fits = [b for b in range(cap, 0, -1) if device is None or need.total(b) <= device]
        if not fits:
            refused.append(_refusal(need, device or 0, source))
            continue
        batches = math.ceil(cell.samples / fits[0])
        batch = math.ceil(cell.samples / batches)  # balanced: 16 samples at most 6 at once run as 5, 5, 6
        slots, budget = need.slots
        arms.append(
            ArmPlan(
                label=cell.label,
                run_id=cell.run_id,
                prompt_tokens=need.prompt,
                max_new_tokens=need.max_new,
                budget=budget,
                slots=slots,
                cache_bytes=need.per_sample,
                samples=cell.samples,
                batch=batch,
                batches=batches,
                activations=need.activations(batch),
                total=need.total(batch),
                note=_note(cell),
            )
        )
    if refused:
        raise BudgetError("\n".join(refused))
    return MemoryPlan(shape, device, source or "no limit", limits.max_batch, tuple(arms))


def _note(cell: Cell) -> str:
    if cell.pending is None:
        return ""
    if cell.budget > cell.protocol.buffer:
        return "K from the task's declared N_avg until the full cache's is measured"
    return "K follows the full cache's measured N_avg: planned as the full cache until then"


def _refusal(need: _Need, device: int, source: str) -> str:
    """Why one sample of a cell does not fit, with the numbers and what would."""
    shape, slots = need.shape, need.slots[0]
    total = need.total(1)
    said = (
        f"{need.cell.label}: one sample needs {decimal(total)} ({decimal(shape.weight_bytes)} of weights + "
        f"{decimal(need.per_sample)} of cache, {slots:,} slots per layer and KV head at "
        f"{slot_bytes(shape) * shape.layers:,} bytes a slot for {need.prompt:,} prompt + {need.max_new:,} "
        f"new tokens, + {decimal(need.activations(1))} of activations + {decimal(RESERVE)} reserve), over "
        f"the {decimal(device)} of the device ({source})"
    )
    fitting = _most_tokens(need, device)
    if fitting:
        return f"{said}: --max-new-tokens {fitting:,} fits one sample, or use a device with more memory"
    if shape.weight_bytes + RESERVE >= device:
        return f"{said}: the weights alone do not fit; use a device with more memory or a smaller model"
    return f"{said}: lower the budget (--budget or --ratio) or use a device with more memory"


def _most_tokens(need: _Need, device: int) -> int:
    """The most new tokens with which one sample fits ``device``; 0 when none does (its need only grows
    with the tokens, so a bisection finds it)."""
    fitting = bisect.bisect_right(range(need.max_new + 1), device, key=lambda t: need.with_tokens(t).total(1))
    return max(fitting - 1, 0)

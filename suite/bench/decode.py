"""``kvbench bench decode``: decode speed and KV memory of policies inside a real model, side by side.

Every policy generates the same fixed number of tokens from the same prompt (stop tokens ignored,
greedy), in one process, after one warm-up generation; the timer covers the decode steps only
(evictions included, prefill excluded). Reported as ratios to ``full``.

Each row is labelled with its regime, as the efficiency papers measure: ``fixed-batch`` (every arm decodes
the same number of rows) or ``iso-memory`` (each arm at its own batch, the largest its memory admits), and
whether it is memory-bound (its batch is what memory admits: more memory would buy more throughput).
Beside tokens/s: ms per eviction event (the engine's clock), the barrier stall (how much longer a decode
step that evicts takes than one that does not: the whole batch waits for the event) and the KV bytes
each sequence frees against the full cache.

With ``precisions`` (protocol names), ``full`` and ``random`` also run inside each protocol's
mixed-precision cache, at its budget unit: a byte budget holds the bytes of K tokens in the model's
precision, so those rows compare with eviction at K at equal memory.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch

from kvbench.adapters.hf.cache import EvictingCache
from kvbench.adapters.hf.calibrate import calibrate
from kvbench.adapters.hf.decode import generate
from kvbench.adapters.hf.models import LoadedModel, load_model
from kvbench.core.contract import Policy
from kvbench.core.schedule import Schedule
from kvbench.errors import BudgetError
from kvbench.registry import make_policy
from kvbench.specs.protocol import load_protocol

PROMPT = "Think step by step and explain, in detail, how to check whether a large number is prime."

Batching = Literal["fixed-batch", "iso-memory"]


@dataclass(frozen=True)
class DecodeTiming:
    policy: str
    tokens: int
    tokens_per_second: float
    """Generated tokens per second, all rows of the batch together."""
    eviction_events: int
    ms_per_event: float
    eviction_share: float
    """Fraction of decode time spent in eviction events."""
    peak_kv_bytes: int
    speed_vs_full: float
    memory_vs_full: float
    precision: str | None = None
    """The protocol whose mixed-precision cache the row ran in (None: the model's precision)."""
    kv_budget_tokens: int | None = None
    """K in tokens as the cache held it (a byte budget converted); None for the full cache."""
    batch: int = 1
    prompt_tokens: int = 0
    device: str = "cpu"
    batching: Batching = "fixed-batch"
    memory_bound: bool = False
    """The batch is the largest the memory admits (more memory would buy more throughput)."""
    barrier_stall_ms: float = 0.0
    """Median decode step with an eviction event minus median step without one: the batch's wait."""
    kv_bytes_freed_per_sequence: int = 0
    """The full cache's peak KV bytes per sequence minus this row's."""
    peak_device_bytes: int | None = None
    """torch.cuda.max_memory_allocated during the row's decode (None off CUDA)."""


def refuse_without_eviction(schedule: Schedule, prompt_len: int, tokens: int, option: str) -> None:
    """A benchmark whose outputs end before the cache ever reaches K + B slots times every policy as the
    full cache: refuse it, naming the option and the fix."""
    needed = 0 if schedule.due(prompt_len) else schedule.tokens_until_due(prompt_len)
    if tokens - 1 < needed:  # the last generated token is never fed back into the cache
        raise BudgetError(
            f"{option} {tokens} after a {prompt_len}-token prompt never fills K + B = "
            f"{schedule.budget} + {schedule.buffer} slots, so no eviction event would fire and every policy "
            f"would be timed as the full cache: raise {option} to at least {needed + 1} or lower the budget"
        )


def bench_decode(
    model: str,
    policies: Sequence[str],
    *,
    tokens: int = 4096,
    budget: int = 512,
    buffer: int = 64,
    seed: int = 0,
    precisions: Sequence[str] = (),
    batch: int | Mapping[str, int] = 1,
    prompt_tokens: int | None = None,
    device: str = "cpu",
    attention: str = "sdpa",
    batching: Batching = "fixed-batch",
    memory_bound: Mapping[str, bool] | None = None,
    loaded: LoadedModel | None = None,
) -> list[DecodeTiming]:
    """``batch`` is one batch for every arm, or each policy's own (iso-memory); ``prompt_tokens`` cuts or
    repeats the prompt to that length; ``memory_bound`` says which arms' batches memory limits (the
    caller knows how it chose them); ``loaded`` reuses a model already loaded on ``device``."""
    loaded = loaded or load_model(model, device=device, attention=attention)
    prompt = _prompt(loaded, prompt_tokens)
    schedule = Schedule(budget=budget, buffer=buffer)
    refuse_without_eviction(schedule, len(prompt), tokens, "--tokens")
    arms = _arms(policies, schedule, precisions)
    calibration = calibrate(loaded) if any("calibration" in p.needs for p, _, _ in arms) else None
    # warm-up, on the full cache
    generate(loaded, prompt, arms[0][0], schedule, sample_seeds=[seed], max_new_tokens=32, ignore_stop=True)
    raw = []
    for policy, arm_schedule, precision in arms:
        rows = batch if isinstance(batch, int) else batch[policy.name]
        clock = _StepClock(loaded.device)
        if loaded.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(loaded.device)
        result = generate(
            loaded,
            prompt,
            policy,
            arm_schedule,
            sample_seeds=[seed + row for row in range(rows)],
            max_new_tokens=tokens,
            ignore_stop=True,
            calibration=calibration,
            on_step=clock.tick,
        )
        peak = torch.cuda.max_memory_allocated(loaded.device) if loaded.device.type == "cuda" else None
        raw.append((policy, precision, rows, result, clock.stall_ms(), peak))
    base = raw[0]
    base_speed = base[2] * tokens / base[3].decode_seconds
    base_per_sequence = base[3].peak_kv_bytes // base[2]
    timings = []
    for policy, precision, rows, result, stall, peak in raw:
        speed = rows * tokens / result.decode_seconds
        events = result.eviction_events
        per_sequence = result.peak_kv_bytes // rows
        timings.append(
            DecodeTiming(
                policy=policy.name if precision is None else f"{policy.name} @ {precision}",
                tokens=tokens,
                tokens_per_second=speed,
                eviction_events=events,
                ms_per_event=result.eviction_seconds / events * 1e3 if events else 0.0,
                eviction_share=result.eviction_seconds / result.decode_seconds,
                peak_kv_bytes=result.peak_kv_bytes,
                speed_vs_full=speed / base_speed,
                memory_vs_full=per_sequence / base_per_sequence,
                precision=precision,
                kv_budget_tokens=result.kv_budget.tokens if result.kv_budget and policy.evicts else None,
                batch=rows,
                prompt_tokens=len(prompt),
                device=str(loaded.device),
                batching=batching,
                memory_bound=bool((memory_bound or {}).get(policy.name, False)) and precision is None,
                barrier_stall_ms=stall if events else 0.0,
                kv_bytes_freed_per_sequence=base_per_sequence - per_sequence,
                peak_device_bytes=peak,
            )
        )
    return timings


def _arms(
    policies: Sequence[str], schedule: Schedule, precisions: Sequence[str]
) -> list[tuple[Policy, Schedule, str | None]]:
    """The full cache first, then each policy, in the model's precision; then the full cache and the null
    under each of ``precisions`` (protocols with a ``precision``), named by it."""
    names = ["full", *[p for p in policies if p != "full"]]
    arms: list[tuple[Policy, Schedule, str | None]] = [(make_policy(name), schedule, None) for name in names]
    for name in precisions:
        protocol = load_protocol(name)
        if protocol.precision is None:
            raise ValueError(f"protocol {name!r} keeps the model's precision: name one with `precision`")
        mixed = replace(schedule, precision=protocol.precision.core(), budget_unit=protocol.budget.unit)
        arms += [(make_policy(policy), mixed, protocol.name) for policy in ("full", "random")]
    return arms


def _prompt(loaded: LoadedModel, length: int | None) -> list[int]:
    """The benchmark's chat prompt, or its text's tokens repeated and cut to ``length``."""
    if length is None:
        return loaded.prompt_ids(PROMPT)
    text = list(loaded.tokenizer.encode(PROMPT, add_special_tokens=False))
    return (text * (length // len(text) + 1))[:length]


class _StepClock:
    """Wall time of every decode step, split by whether the step's eviction check evicted."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.last: float | None = None
        self.events = 0
        self.with_event: list[float] = []
        self.without_event: list[float] = []

    def tick(self, cache: EvictingCache) -> None:
        if self.device.type == "cuda":  # the step's kernels, eviction included, end inside its own interval
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        events = cache.evictor.stats.events
        if self.last is not None:
            (self.with_event if events > self.events else self.without_event).append(now - self.last)
        self.last, self.events = now, events

    def stall_ms(self) -> float:
        if not self.with_event or not self.without_event:
            return 0.0
        return (statistics.median(self.with_event) - statistics.median(self.without_event)) * 1e3

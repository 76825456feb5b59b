"""``kvbench bench decode``: decode speed and KV memory of policies inside a real model, side by side.

Every policy generates the same fixed number of tokens from the same prompt (stop tokens ignored,
greedy), in one process, after one warm-up generation; the timer covers the decode steps only
(evictions included, prefill excluded). Reported as ratios to ``full``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.adapters.hf.calibrate import calibrate
from kvbench.adapters.hf.decode import generate
from kvbench.adapters.hf.models import load_model
from kvbench.core.schedule import Schedule
from kvbench.registry import make_policy

PROMPT = "Think step by step and explain, in detail, how to check whether a large number is prime."


@dataclass(frozen=True)
class DecodeTiming:
    policy: str
    tokens: int
    tokens_per_second: float
    eviction_events: int
    ms_per_event: float
    eviction_share: float
    """Fraction of decode time spent in eviction events."""
    peak_kv_bytes: int
    speed_vs_full: float
    memory_vs_full: float


def bench_decode(
    model: str,
    policies: Sequence[str],
    *,
    tokens: int = 4096,
    budget: int = 512,
    buffer: int = 64,
    seed: int = 0,
) -> list[DecodeTiming]:
    names = ["full", *[p for p in policies if p != "full"]]
    loaded = load_model(model)
    prompt = loaded.prompt_ids(PROMPT)
    schedule = Schedule(budget=budget, buffer=buffer)
    built = [make_policy(name) for name in names]
    calibration = calibrate(loaded) if any("calibration" in p.needs for p in built) else None
    generate(
        loaded, prompt, built[0], schedule, sample_seeds=[seed], max_new_tokens=32, ignore_stop=True
    )  # warm-up
    raw = []
    for policy in built:
        result = generate(
            loaded,
            prompt,
            policy,
            schedule,
            sample_seeds=[seed],
            max_new_tokens=tokens,
            ignore_stop=True,
            calibration=calibration,
        )
        raw.append((policy.name, result))
    base_speed = tokens / raw[0][1].decode_seconds
    base_memory = raw[0][1].peak_kv_bytes
    timings = []
    for name, result in raw:
        speed = tokens / result.decode_seconds
        events = result.eviction_events
        timings.append(
            DecodeTiming(
                policy=name,
                tokens=tokens,
                tokens_per_second=speed,
                eviction_events=events,
                ms_per_event=result.eviction_seconds / events * 1e3 if events else 0.0,
                eviction_share=result.eviction_seconds / result.decode_seconds,
                peak_kv_bytes=result.peak_kv_bytes,
                speed_vs_full=speed / base_speed,
                memory_vs_full=result.peak_kv_bytes / base_memory,
            )
        )
    return timings

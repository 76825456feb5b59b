"""``kvbench bench decode``: decode speed and KV memory of policies inside a real model, side by side.

Every policy generates the same fixed number of tokens from the same prompt (stop tokens ignored,
greedy), in one process, after one warm-up generation; the timer covers the decode steps only
(evictions included, prefill excluded). Reported as ratios to ``full``.

With ``precisions`` (protocol names), ``full`` and ``random`` also run inside each protocol's
mixed-precision cache, at its budget unit: a byte budget holds the bytes of K tokens in the model's
precision, so those rows compare with eviction at K at equal memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvbench.adapters.hf.calibrate import calibrate
from kvbench.adapters.hf.decode import generate
from kvbench.adapters.hf.models import load_model
from kvbench.core.contract import Policy
from kvbench.core.schedule import Schedule
from kvbench.registry import make_policy
from kvbench.specs.protocol import load_protocol

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
    precision: str | None = None
    """The protocol whose mixed-precision cache the row ran in (None: the model's precision)."""
    kv_budget_tokens: int | None = None
    """K in tokens as the cache held it (a byte budget converted); None for the full cache."""


def bench_decode(
    model: str,
    policies: Sequence[str],
    *,
    tokens: int = 4096,
    budget: int = 512,
    buffer: int = 64,
    seed: int = 0,
    precisions: Sequence[str] = (),
) -> list[DecodeTiming]:
    names = ["full", *[p for p in policies if p != "full"]]
    loaded = load_model(model)
    prompt = loaded.prompt_ids(PROMPT)
    schedule = Schedule(budget=budget, buffer=buffer)
    built = [make_policy(name) for name in names]
    arms: list[tuple[Policy, Schedule, str | None]] = [(policy, schedule, None) for policy in built]
    for name in precisions:
        protocol = load_protocol(name)
        if protocol.precision is None:
            raise ValueError(f"protocol {name!r} keeps the model's precision: name one with `precision`")
        mixed = replace(schedule, precision=protocol.precision.core(), budget_unit=protocol.budget.unit)
        arms += [(make_policy(policy), mixed, protocol.name) for policy in ("full", "random")]
    calibration = calibrate(loaded) if any("calibration" in p.needs for p in built) else None
    generate(
        loaded, prompt, built[0], schedule, sample_seeds=[seed], max_new_tokens=32, ignore_stop=True
    )  # warm-up
    raw = []
    for policy, arm_schedule, precision in arms:
        result = generate(
            loaded,
            prompt,
            policy,
            arm_schedule,
            sample_seeds=[seed],
            max_new_tokens=tokens,
            ignore_stop=True,
            calibration=calibration,
        )
        raw.append((policy, precision, result))
    base_speed = tokens / raw[0][2].decode_seconds
    base_memory = raw[0][2].peak_kv_bytes
    timings = []
    for policy, precision, result in raw:
        speed = tokens / result.decode_seconds
        events = result.eviction_events
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
                memory_vs_full=result.peak_kv_bytes / base_memory,
                precision=precision,
                kv_budget_tokens=result.kv_budget.tokens if result.kv_budget and policy.evicts else None,
            )
        )
    return timings

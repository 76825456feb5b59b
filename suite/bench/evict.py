"""``kvbench bench evict``: the cost of one eviction event per policy, at paper shapes, side by side.

One layer of Hkv KV heads and Hq query heads of dim D holds K + B slots (the moment an event fires);
each policy scores the K candidates and the engine keeps K − B of them plus the buffer. Every policy
runs on the same tensors in the same process; times are medians of torch.utils.benchmark and are
reported with their ratio to ``random`` (the cheapest sensible policy: one draw, one top-k, one gather).
With ``telemetry_cost`` every policy is also timed with the retention telemetry off (kvbench.core.retention),
interleaved with the run that has it on, and the ratio of the two is reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.benchmark import Timer

from kvbench.core.calibration import QueryStats
from kvbench.core.contract import ModelFacts, Policy
from kvbench.core.engine import Evictor
from kvbench.core.layer_kv import LayerKV
from kvbench.core.rope import apply_rope, rope_inv_freq
from kvbench.core.schedule import Schedule
from kvbench.registry import known_policies, make_policy


@dataclass(frozen=True)
class EvictTiming:
    policy: str
    batch: int
    ms_per_event: float
    ratio_to_random: float
    runs: int
    telemetry_ratio: float | None = None
    """With ``telemetry_cost``: ms per event with the retention telemetry over ms without it."""


def _layer(batch: int, model: ModelFacts, slots: int, dtype: torch.dtype, gen: torch.Generator) -> LayerKV:
    shape = (batch, model.num_kv_heads, slots, model.head_dim)
    positions = torch.arange(slots).expand(batch, model.num_kv_heads, slots).contiguous()
    keys = apply_rope(torch.randn(shape, generator=gen), positions, model.rope_inv_freq).to(dtype)
    layer = LayerKV(keys, torch.randn(shape, generator=gen).to(dtype), positions)
    # H2O's accumulator, as if it had been observing all along
    layer.state.register_slot("acc", torch.rand(shape[:3], generator=gen), fill=0.0)
    return layer


def bench_evict(
    policies: Sequence[str] | None = None,
    *,
    batches: Sequence[int] = (1, 16),
    kv_heads: int = 8,
    q_heads: int = 32,
    head_dim: int = 128,
    budget: int = 2048,
    buffer: int = 64,
    prompt_len: int = 256,
    dtype: torch.dtype = torch.float32,
    min_run_time: float = 1.0,
    isolated: Sequence[str] = (),
    telemetry_cost: bool = False,
) -> list[EvictTiming]:
    """``isolated`` scorer files (FILE.py:Class) are timed twice: in this process and in their own process
    behind the sandbox (kvbench.isolation), so the difference is what isolation costs per event."""
    names = [n for n in (policies or ([] if isolated else known_policies())) if make_policy(n).evicts]
    if "random" not in names:
        names = ["random", *names]
    arms: list[tuple[str, Policy]] = [(name, make_policy(name)) for name in names]
    for text in isolated:
        from kvbench.isolation.host import isolated as isolate

        apart = isolate(text)
        arms += [(f"{apart.name} (in process)", make_policy(text)), (f"{apart.name} (isolated)", apart)]
    model = ModelFacts("bench", 1, q_heads, kv_heads, head_dim, rope_inv_freq=rope_inv_freq(head_dim).float())
    schedule = Schedule(budget=budget, buffer=buffer, protection="prompt")
    gen = torch.Generator().manual_seed(0)
    calibration = QueryStats.from_queries(
        "bench", "random", [torch.randn(q_heads, 256, head_dim, generator=gen)]
    )
    results: list[EvictTiming] = []
    for batch in batches:
        layer = _layer(batch, model, budget + buffer, dtype, gen)
        queries = apply_rope(
            torch.randn(batch, q_heads, buffer, head_dim, generator=gen),
            torch.arange(budget, budget + buffer).expand(batch, q_heads, buffer),
            model.rope_inv_freq,
        ).to(dtype)
        times: dict[str, tuple[float, int]] = {}
        without: dict[str, float] = {}
        for name, policy in arms:
            evictors = {
                on: Evictor(
                    policy,
                    schedule,
                    model,
                    prompt_len=prompt_len,
                    row_seeds=range(batch),
                    calibration=calibration,
                    telemetry=on,
                )
                for on in (False, True)
            }

            shared = {"layer": layer, "step": budget + buffer, "queries": queries}

            def timed(telemetry: bool, evictors=evictors, shared=shared) -> tuple[float, int]:
                timer = Timer(
                    "evictor.evict([layer], step=step, queries=[queries])",
                    globals={**shared, "evictor": evictors[telemetry]},
                )
                measurement = timer.blocked_autorange(min_run_time=min_run_time)
                return measurement.median * 1e3, len(measurement.times)

            if telemetry_cost:  # off, on, off, on: a load that drifts meets both alike
                pairs = [(timed(False)[0], timed(True)) for _ in range(2)]
                without[name] = min(off for off, _ in pairs)
                times[name] = min((on for _, on in pairs), key=lambda t: t[0])
            else:
                times[name] = timed(True)
        base = times["random"][0]
        results += [
            EvictTiming(n, batch, ms, ms / base, runs, ms / without[n] if n in without else None)
            for n, (ms, runs) in times.items()
        ]
    return results

"""``kvbench bench evict``: the cost of one eviction event per policy, at paper shapes, side by side.

``layers`` layers of Hkv KV heads and Hq query heads of dim D hold K + B slots each (the moment an event
fires); each policy scores the K candidates and the engine keeps K − B of them plus the buffer. Every
policy runs on the same tensors in the same process; times are medians (torch.utils.benchmark on the CPU,
CUDA events around each event on a GPU) and are reported with their ratio to ``random`` (the cheapest
sensible policy: one draw, one top-k, one gather) and beside the copy floor: the bytes the compaction
must read and write, over the device's copy bandwidth measured here.
Each is timed on two kinds of keys: random draws (no key has a near-duplicate: the worst case of a
search that stops at a row's first match) and keys a real model made (kvbench.bench.real_keys), which
are what a run meets.
With ``telemetry_cost`` every policy is also timed with the retention telemetry off (kvbench.core.retention),
interleaved with the run that has it on, and the ratio of the two is reported.
"""

from __future__ import annotations

import functools
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from kvbench.bench.real_keys import RealKeys, captured, fits
from kvbench.core.calibration import QueryStats
from kvbench.core.contract import ModelFacts, Policy
from kvbench.core.engine import Evictor
from kvbench.core.layer_kv import LayerKV
from kvbench.core.mixed_kv import Slots
from kvbench.core.rope import apply_rope, rope_inv_freq
from kvbench.core.schedule import Schedule
from kvbench.registry import known_policies, make_policy
from kvbench.specs.protocol import NULL_POLICY

KV_HEADS, Q_HEADS, HEAD_DIM = 8, 32, 128
"""The bench's attention shape: a common one among the models the papers evaluate (Qwen3-8B, Llama-3.1-8B)."""


@dataclass(frozen=True)
class EvictTiming:
    policy: str
    batch: int
    ms_per_event: float
    ratio_to_random: float
    runs: int
    layers: int = 1
    bytes_moved: int = 0
    """Bytes one event must read and write at least: the K kept slots' keys, values and positions."""
    copy_floor_ms: float = 0.0
    """``bytes_moved`` over the device's measured copy bandwidth: no eviction of K slots is faster."""
    telemetry_ratio: float | None = None
    """With ``telemetry_cost``: ms per event with the retention telemetry over ms without it."""
    keys: str = "random"
    """The keys it was timed on: ``random`` draws or ``real`` ones (kvbench.bench.real_keys)."""


def _layer(
    batch: int,
    model: ModelFacts,
    slots: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    device: torch.device,
    real: RealKeys | None = None,
) -> LayerKV:
    """A cache of ``slots`` slots that owns its buffers (with room for ``slots``), as a run's cache does:
    random draws, or the first ``slots`` of ``real`` keys and values."""
    shape = (batch, model.num_kv_heads, slots, model.head_dim)
    inv_freq = model.rope_inv_freq.to(device) if model.rope_inv_freq is not None else None
    positions = torch.arange(slots, device=device).expand(batch, model.num_kv_heads, slots)
    if real is None:
        keys = apply_rope(torch.randn(shape, generator=gen, device=device), positions, inv_freq).to(dtype)
        values = torch.randn(shape, generator=gen, device=device).to(dtype)
    else:
        keys = real.keys[:, :slots].to(device, dtype).expand(shape)
        values = real.values[:, :slots].to(device, dtype).expand(shape)
    layer = LayerKV.empty(
        batch, model.num_kv_heads, model.head_dim, dtype=dtype, device=device, capacity=slots
    )
    layer.append(keys, values, positions)
    # H2O's accumulator, as if it had been observing all along
    layer.state.register_slot("acc", torch.rand(shape[:3], generator=gen, device=device), fill=0.0)
    return layer


class _Rolling:
    """``layers`` caches of K + B slots, as a run's cache is when an event fires: the event compacts them
    to K and the next B tokens, appended untimed, fill them again, so each event meets a live cache. The
    appended keys and values are new draws, rotated as the model's are, so the cache never fills with
    copies of the same few keys (R-KV's near-duplicate search would meet nothing else). With ``real`` keys,
    the next B tokens of the captured trace come instead."""

    def __init__(
        self,
        layers: list[LayerKV],
        buffer: int,
        step: int,
        gen: torch.Generator,
        inv_freq: Tensor,
        real: RealKeys | None = None,
    ) -> None:
        self.layers: list[Slots] = list(layers)
        self.buffer, self.step, self.gen, self.inv_freq, self.real = buffer, step, gen, inv_freq, real

    def event(self, evictor: Evictor, queries: Tensor) -> None:
        self.layers = evictor.evict(self.layers, step=self.step, queries=[queries] * len(self.layers))

    def refill(self) -> None:
        first = self.layers[0]
        batch, heads, _, dim = first.keys.shape
        device = first.keys.device
        positions = torch.arange(self.step, self.step + self.buffer, device=device).expand(batch, heads, -1)
        if self.real is not None:
            later = slice(self.step, self.step + self.buffer)
            keys = self.real.keys[:, later].to(device, first.keys.dtype).expand(batch, heads, -1, dim)
            values = self.real.values[:, later].to(device, first.values.dtype).expand(batch, heads, -1, dim)
            for layer in self.layers:
                layer.append(keys, values, positions)
            self.step += self.buffer
            return
        for layer in self.layers:
            drawn = torch.randn(2, batch, heads, self.buffer, dim, generator=self.gen, device=device)
            keys = apply_rope(drawn[0], positions, self.inv_freq).to(first.keys.dtype)
            layer.append(keys, drawn[1].to(first.values.dtype), positions)
        self.step += self.buffer


def median_ms(
    call: Callable[[], object],
    device: torch.device,
    min_run_time: float,
    between: Callable[[], object] | None = None,
    max_runs: int | None = None,
) -> tuple[float, int]:
    """The median milliseconds of ``call`` and how many runs it took (at most ``max_runs``), ``between``
    run untimed after each.
    On the CPU, wall time with one torch thread (torch.utils.benchmark's default, so that the figures stay
    comparable with earlier ones); on a GPU, CUDA events around each call (its kernels, not their
    launch), after one warm-up call."""
    cuda = device.type == "cuda"
    threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(1)
    try:
        call()
        if between is not None:
            between()
        times: list[float] = []
        started = time.perf_counter()
        while (len(times) < 5 or time.perf_counter() - started < min_run_time) and len(times) < (
            max_runs or len(times) + 1
        ):
            if cuda:
                torch.cuda.synchronize(device)
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                call()
                end.record()
                end.synchronize()
                times.append(begin.elapsed_time(end))
            else:
                tick = time.perf_counter()
                call()
                times.append((time.perf_counter() - tick) * 1e3)
            if between is not None:
                between()
        return statistics.median(times), len(times)
    finally:
        torch.set_num_threads(threads)


def copy_bandwidth(device: torch.device, nbytes: int, min_run_time: float = 0.2) -> float:
    """Bytes per second one device-to-device copy of ``nbytes`` reads and writes (2 × nbytes per copy)."""
    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    ms, _ = median_ms(lambda: target.copy_(source), device, min_run_time)
    return 2 * nbytes / (ms / 1e3)


REAL_EVENTS = 24
"""Timed events on real keys at most: each takes the trace's next B tokens, and the trace is captured once
at K + B × (REAL_EVENTS + 2) tokens (a warm-up event, and the refill after the last)."""


@dataclass(frozen=True)
class _Setup:
    """What every arm of one bench shares: the model's shape, the schedule, the queries' statistics."""

    model: ModelFacts
    schedule: Schedule
    calibration: QueryStats
    prompt_len: int
    real: RealKeys | None = None
    """Real keys and values to time on; None: random draws."""

    def timer(
        self, policy: Policy, queries: Tensor, dtype: torch.dtype, min_run_time: float, *, telemetry: bool
    ) -> Callable[[], tuple[float, int]]:
        """Times ``policy``'s events on a cache that every arm starts from alike (the generator restarts)."""
        batch, device = queries.shape[0], queries.device
        evictor = Evictor(
            policy,
            self.schedule,
            self.model,
            prompt_len=self.prompt_len,
            row_seeds=range(batch),
            calibration=self.calibration,
            telemetry=telemetry,
        )
        start = torch.Generator(device=device).manual_seed(batch)
        slots = self.schedule.budget + self.schedule.buffer
        real = self.real
        cache = [
            _layer(batch, self.model, slots, dtype, start, device, real) for _ in range(self.model.num_layers)
        ]
        inv_freq = self.model.rope_inv_freq.to(device)
        rolling = _Rolling(cache, self.schedule.buffer, slots, start, inv_freq, real)
        event = functools.partial(rolling.event, evictor, queries)
        runs = REAL_EVENTS if real is not None else None
        return functools.partial(median_ms, event, device, min_run_time, rolling.refill, runs)

    def time_arms(
        self,
        arms: Sequence[tuple[str, Policy]],
        queries: Tensor,
        dtype: torch.dtype,
        min_run_time: float,
        *,
        telemetry_cost: bool,
    ) -> tuple[dict[str, tuple[float, int]], dict[str, float]]:
        """Each arm's (median ms, runs) with the telemetry on and, with ``telemetry_cost``, its ms without."""
        times: dict[str, tuple[float, int]] = {}
        without: dict[str, float] = {}
        for name, policy in arms:
            timed = {
                on: self.timer(policy, queries, dtype, min_run_time, telemetry=on) for on in (False, True)
            }
            if telemetry_cost:  # off, on, off, on: a load that drifts meets both alike
                pairs = [(timed[False]()[0], timed[True]()) for _ in range(2)]
                without[name] = min(off for off, _ in pairs)
                times[name] = min((on for _, on in pairs), key=lambda t: t[0])
            else:
                times[name] = timed[True]()
        return times, without


def bench_evict(
    policies: Sequence[str] | None = None,
    *,
    batches: Sequence[int] = (1, 16),
    kv_heads: int = KV_HEADS,
    q_heads: int = Q_HEADS,
    head_dim: int = HEAD_DIM,
    budget: int = 2048,
    buffer: int = 64,
    prompt_len: int = 256,
    dtype: torch.dtype = torch.float32,
    min_run_time: float = 1.0,
    isolated: Sequence[str] = (),
    layers: int = 1,
    device: str = "cpu",
    bandwidth_bytes: int = 1 << 28,
    telemetry_cost: bool = False,
    keys: Sequence[str] = ("random", "real"),
    said: Callable[[str], object] = print,
) -> list[EvictTiming]:
    """``isolated`` scorer files (FILE.py:Class) are timed twice: in this process and in their own process
    behind the sandbox (kvbench.isolation), so the difference is what isolation costs per event.

    One event evicts ``layers`` layers of one cache that rolls on as a run's does (kvbench.bench.evict's
    _Rolling); the copy bandwidth is measured on a copy of ``bandwidth_bytes``. Each of ``keys`` (random,
    real) times every arm on those keys; real keys that cannot be had at the shape are skipped, and why is
    ``said``."""
    where = torch.device(device)
    names = [n for n in (policies or ([] if isolated else known_policies())) if make_policy(n).evicts]
    if NULL_POLICY not in names:
        names = [NULL_POLICY, *names]
    arms: list[tuple[str, Policy]] = [(name, make_policy(name)) for name in names]
    for text in isolated:
        from kvbench.isolation.host import isolated as isolate

        apart = isolate(text)
        arms += [(f"{apart.name} (in process)", make_policy(text)), (f"{apart.name} (isolated)", apart)]
    inv_freq = rope_inv_freq(head_dim).float()
    model = ModelFacts("bench", layers, q_heads, kv_heads, head_dim, rope_inv_freq=inv_freq)
    gen = torch.Generator().manual_seed(0)
    calibration = QueryStats.from_queries(
        "bench", "random", [torch.randn(q_heads, 256, head_dim, generator=gen) for _ in range(layers)]
    )
    schedule = Schedule(budget=budget, buffer=buffer, protection="prompt")
    setups = {}
    for kind in keys:
        if kind == "random":
            setups[kind] = _Setup(model, schedule, calibration, prompt_len)
            continue
        tokens = budget + buffer * (REAL_EVENTS + 2)
        why_not = fits(kv_heads, head_dim, tokens)
        if why_not:
            said(f"real keys: not timed at this shape ({why_not})")
            continue
        real = captured(kv_heads, head_dim, tokens)
        said(f"real keys: {real.description}")
        setups[kind] = _Setup(model, schedule, calibration, prompt_len, real)
    on_device = torch.Generator(device=where).manual_seed(0)
    bandwidth = copy_bandwidth(where, bandwidth_bytes)
    results: list[EvictTiming] = []
    for (kind, setup), batch in itertools.product(setups.items(), batches):
        query_positions = torch.arange(budget, budget + buffer, device=where).expand(batch, q_heads, buffer)
        queries = apply_rope(
            torch.randn(batch, q_heads, buffer, head_dim, generator=on_device, device=where),
            query_positions,
            inv_freq.to(where),
        ).to(dtype)
        # the K kept slots' keys and values (and int64 positions), read once and written once, per layer
        moved = 2 * layers * batch * kv_heads * budget * (2 * head_dim * dtype.itemsize + 8)
        times, without = setup.time_arms(arms, queries, dtype, min_run_time, telemetry_cost=telemetry_cost)
        base = times[NULL_POLICY][0]
        results += [
            EvictTiming(
                n,
                batch,
                ms,
                ms / base,
                runs,
                layers,
                moved,
                moved / bandwidth * 1e3,
                ms / without[n] if n in without else None,
                kind,
            )
            for n, (ms, runs) in times.items()
        ]
    return results


GOAL_TIMES_RANDOM, GOAL_TIMES_FLOOR = 10.0, 2.0
"""The eviction-cost goal (docs/benchmarks.md): every policy within 10× random, random within 2× its copy
floor."""


def beyond_goal(
    results: Sequence[EvictTiming],
    *,
    budget: int,
    layers: int,
    kv_heads: int = KV_HEADS,
    head_dim: int = HEAD_DIM,
) -> list[str]:
    """A line for each measurement outside the goal, saying why where the arithmetic explains it: R-KV's
    screen on random keys multiplies every pair of keys, which this machine's measured rate prices."""
    from kvbench.core.hardware import product_gflops, screen_dtype, screen_strip
    from kvbench.policies.near_duplicates import screen_flops

    real = {(r.policy, r.batch): r for r in results if r.keys == "real"}
    lines = []
    for r in results:
        if (
            r.policy == NULL_POLICY
            and r.copy_floor_ms
            and r.ms_per_event > GOAL_TIMES_FLOOR * r.copy_floor_ms
        ):
            lines.append(
                f"over the goal: random at batch {r.batch} ({r.keys} keys) takes "
                f"{r.ms_per_event / r.copy_floor_ms:.2f}× its copy floor (goal ≤ {GOAL_TIMES_FLOOR:g}×)"
            )
        if r.ratio_to_random <= GOAL_TIMES_RANDOM:
            continue
        line = (
            f"over the goal: {r.policy} at batch {r.batch} ({r.keys} keys) is {r.ratio_to_random:.1f}× random"
        )
        if r.policy == "rkv-official" and r.keys == "random":
            dtype = screen_dtype("cpu")
            flops = screen_flops(budget, head_dim, screen_strip("cpu")) * kv_heads * r.batch * layers
            rate = product_gflops(dtype)
            line += (
                f": its near-duplicate screen multiplies every pair of random keys, {flops / 1e9:.1f} GFLOP "
                f"per event, which at this CPU's measured {rate:.0f} GFLOP/s ({dtype}, one thread) alone "
                f"takes {flops / rate / 1e6:.0f} ms"
            )
        if (r.policy, r.batch) in real and r.keys == "random":
            line += f"; on real keys {real[(r.policy, r.batch)].ratio_to_random:.1f}× random"
        lines.append(line)
    return lines

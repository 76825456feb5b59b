"""``kvbench bench serve``: the full cache and each policy on a vLLM engine, side by side, as ratios.

Every arm gets a fresh engine with identical settings (prefix caching off, the same block size, the same
maximum length and the same fixed KV pool), one warm-up request, then two regimes:

- memory-bound: ``requests`` requests submitted at once, ``ignore_eos``, each ``output_len`` tokens long,
  into a pool of ``pool_blocks`` blocks: output tokens/s, requests/s, the most requests running at once,
  the most blocks held, preemptions (kvbench's admission makes them 0 for every arm);
- compute-bound: one request alone, the same length: seconds per output token (TPOT, its short prefill
  included).

Eviction cost is split into choosing (the policy and top-k) and moving (reading and writing the pages).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvbench.adapters.base import GREEDY
from kvbench.bench.decode import PROMPT, refuse_without_eviction
from kvbench.core.schedule import Schedule
from kvbench.registry import make_policy


@dataclass(frozen=True)
class ServeTiming:
    policy: str
    requests: int
    output_len: int
    output_tokens_per_second: float
    requests_per_second: float
    peak_running: int
    peak_blocks: int
    pool_blocks: int
    preemptions: int
    tpot_ms: float
    eviction_events: int
    select_ms_per_event: float
    move_ms_per_event: float
    eviction_share: float
    """Share of the memory-bound run's wall time spent in eviction events."""
    batching: str = "iso-memory"
    """Every arm gets the same KV pool (``pool_blocks``), so each runs as many requests as it fits."""
    memory_bound: bool = False
    """The pool held fewer requests at once than were submitted: more memory would run more."""
    speed_vs_full: float = 0.0
    tpot_vs_full: float = 0.0
    concurrency_vs_full: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def bench_serve(
    model: str,
    policies: Sequence[str],
    *,
    budget: int,
    buffer: int,
    requests: int,
    output_len: int,
    pool_blocks: int,
) -> list[ServeTiming]:
    from kvbench.adapters.vllm.backend import BLOCK_SIZE, VLLMBackend, start_engine
    from kvbench.adapters.vllm.checkpoint import materialize
    from kvbench.specs.model import load_model_spec

    loaded, checkpoint = materialize(load_model_spec(model))
    facts = loaded.facts
    import torch

    element = getattr(torch, loaded.spec.dtype).itemsize
    block_bytes = BLOCK_SIZE * 2 * facts.num_layers * facts.num_kv_heads * facts.head_dim * element
    prompt = loaded.prompt_ids(PROMPT)
    schedule = Schedule(budget=budget, buffer=buffer)
    refuse_without_eviction(schedule, len(prompt), output_len, "--output-len")
    names = ["full", *[p for p in policies if p != "full"]]
    rows = []
    for name in names:
        policy = make_policy(name)
        llm, pids = start_engine(
            checkpoint,
            loaded.spec.dtype,
            kv_cache_memory_bytes=pool_blocks * block_bytes,
            max_model_len=len(prompt) + output_len + BLOCK_SIZE,
        )
        backend = VLLMBackend(loaded, llm, checkpoint, pids)
        try:
            _timed(backend, prompt, policy, schedule, 1, output_len)  # warm-up
            backend.engine_stats(reset=True)
            wall, crowd = _timed(backend, prompt, policy, schedule, requests, output_len)
            engine = backend.engine_stats(reset=True)
            preemptions = backend.preemptions()
            alone, _ = _timed(backend, prompt, policy, schedule, 1, output_len)
        finally:
            backend.close()
        events = sum(s.evictions for s in crowd.samples)
        stats = crowd.settings.get("eviction_stats", {})
        rows.append(
            ServeTiming(
                policy=name,
                requests=requests,
                output_len=output_len,
                output_tokens_per_second=requests * output_len / wall,
                requests_per_second=requests / wall,
                peak_running=engine["peak_running"],
                peak_blocks=engine["peak_blocks"],
                pool_blocks=pool_blocks,
                preemptions=preemptions,
                tpot_ms=alone / output_len * 1e3,
                eviction_events=events,
                select_ms_per_event=stats.get("select", 0.0) / max(events, 1) * 1e3,
                move_ms_per_event=stats.get("move", 0.0) / max(events, 1) * 1e3,
                eviction_share=crowd.eviction_seconds / wall,
                memory_bound=engine["peak_running"] < requests,
                extra={"block_size": BLOCK_SIZE, "block_bytes": block_bytes, "prompt_tokens": len(prompt)},
            )
        )
    full = rows[0]
    return [
        replace(
            r,
            speed_vs_full=r.output_tokens_per_second / full.output_tokens_per_second,
            tpot_vs_full=r.tpot_ms / full.tpot_ms,
            concurrency_vs_full=r.peak_running / max(full.peak_running, 1),
        )
        for r in rows
    ]


def _timed(
    backend: Any, prompt: list[int], policy: Any, schedule: Schedule, count: int, length: int
) -> tuple[float, Any]:
    started = time.perf_counter()
    result = backend.generate(
        prompt,
        policy,
        schedule,
        sample_seeds=list(range(count)),
        sampling=GREEDY,
        max_new_tokens=length,
        ignore_stop=True,
    )
    return time.perf_counter() - started, result

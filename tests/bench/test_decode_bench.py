"""`kvbench bench decode` with mixed-precision rows: the memory each row reports is its cache's."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.bench.decode import bench_decode
from kvbench.errors import BudgetError

MIXED = Path(__file__).parents[1] / "fixtures" / "protocols" / "mixed-4bit-g8.yaml"


def test_mixed_precision_rows_hold_more_tokens_in_the_memory_of_eviction_alone() -> None:
    timings = bench_decode(
        "tiny-qwen3", ["random"], tokens=800, budget=192, buffer=16, precisions=[f"{MIXED}"]
    )
    rows = {r.policy: r for r in timings}
    assert list(rows) == ["full", "random", "full @ mixed-4bit-g8", "random @ mixed-4bit-g8"]
    # the tiny Qwen3 in float32: 2 layers x 2 KV heads x keys and values x 16 channels x 4 bytes per token
    # in full precision; at 4 bits, 2 groups of 8 channels, each 4 code bytes + fp16 scale and offset
    full_token, packed_token = 2 * 2 * 2 * 16 * 4, 2 * 2 * 2 * 2 * (4 + 4)
    assert rows["random"].kv_budget_tokens == 192
    assert rows["random"].peak_kv_bytes == (192 + 16) * full_token
    # the bytes of 192 tokens hold the 16-token buffer, 32 high-precision tokens and 576 packed ones; at
    # its peak (K + B slots) the B newest are in full precision too
    mixed = rows["random @ mixed-4bit-g8"]
    assert mixed.kv_budget_tokens == 48 + (192 - 48) * full_token // packed_token == 624
    assert mixed.eviction_events > 0
    assert mixed.peak_kv_bytes == (48 + 16) * full_token + (624 - 48) * packed_token
    assert mixed.peak_kv_bytes == rows["random"].peak_kv_bytes  # equal memory, 624 tokens instead of 192
    # without eviction, quantization alone: all but the newest 16 to 32 (and N_hp) tokens packed
    assert rows["full @ mixed-4bit-g8"].peak_kv_bytes < rows["full"].peak_kv_bytes / 2
    assert all(r.tokens_per_second > 0 for r in rows.values())


def test_outputs_too_short_to_reach_an_event_are_refused_at_the_boundary() -> None:
    # a 20-token prompt under K=32, B=8 first evicts when the cache holds 40 slots: 20 generated tokens
    # feed 19 back, one short; 21 reach it
    with pytest.raises(BudgetError, match=r"--tokens 20 .* raise --tokens to at least 21"):
        bench_decode("tiny-qwen3", ["random"], tokens=20, budget=32, buffer=8, prompt_tokens=20)
    (full, random) = bench_decode("tiny-qwen3", ["random"], tokens=21, budget=32, buffer=8, prompt_tokens=20)
    assert (full.eviction_events, random.eviction_events) == (0, 1)
    assert random.batching == "fixed-batch" and not random.memory_bound
    assert random.prompt_tokens == 20
    assert random.kv_bytes_freed_per_sequence == 0  # both peak at K + B = 40 slots before the one event

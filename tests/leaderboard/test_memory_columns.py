"""The leaderboard's memory columns, beside K: what a real run's cache held and cost, at equal bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.leaderboard import queries
from kvbench.leaderboard.queries import Compression

# the tiny Qwen3: 2 layers x 2 KV heads, head dim 16, float32; the probes' traces are 1024 tokens
LAYERS_HEADS, FULL_TOKEN = 2 * 2, 2 * 16 * 4
PACKED_TOKEN = 2 * 2 * (8 * 4 // 8 + 4)  # 4 bits in 2 groups of 8 channels, fp16 scale and offset


def test_a_mixed_precision_table_shows_more_tokens_in_the_bytes_of_eviction_alone(board_db: Path) -> None:
    at_4x = Compression(4.0, None)
    plain = queries.leaderboard(board_db, "tiny-qwen3", "protect-prompt", at_4x).frame.set_index("policy")
    mixed = queries.leaderboard(board_db, "tiny-qwen3", "mixed-4bit-g8", at_4x).frame.set_index("policy")
    # eviction alone: K = 1024 / 4 tokens in float32
    assert plain.loc["random", "K held/N_avg"] == 0.25
    assert plain.loc["random", "bytes/token"] == LAYERS_HEADS * FULL_TOKEN
    assert plain.loc["random", "byte budget (MiB)"] == 256 * LAYERS_HEADS * FULL_TOKEN / 2**20
    # mixed-4bit: the bytes of 256 float32 tokens hold 64 buffer + 32 high-precision tokens and as many
    # packed ones as fit, rounded down to the 64-token buffer
    held = (96 + (256 - 96) * FULL_TOKEN // PACKED_TOKEN) // 64 * 64
    cost = LAYERS_HEADS * (96 * FULL_TOKEN + (held - 96) * PACKED_TOKEN)
    assert held == 704
    assert mixed.loc["random", "K held/N_avg"] == held / 1024
    assert mixed.loc["random", "bytes/token"] == pytest.approx(cost / held)
    assert mixed.loc["random", "byte budget (MiB)"] == pytest.approx(cost / 2**20)
    assert cost <= 256 * LAYERS_HEADS * FULL_TOKEN
    for frame in (plain, mixed):  # the full cache holds no budget
        assert frame.loc["full", ["K held/N_avg", "bytes/token"]].isna().all()

"""The real keys `kvbench bench evict` times on: the embedded model's own, captured once and read back,
with the near-duplicates a language model's keys have and random draws lack (why rkv-official's cost
differs between the two)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from invoke import kvbench

from kvbench.bench.real_keys import captured, fits
from kvbench.cache_folder import cache_root

pytestmark = pytest.mark.slow


def matched_among_newest(keys: torch.Tensor, columns: int, threshold: float = 0.5) -> float:
    """The share of rows whose cosine with some other key among the newest ``columns`` passes threshold."""
    unit = F.normalize(keys, dim=-1)
    cos = unit @ unit[:, -columns:].mT
    n = unit.shape[1]
    cos[:, n - columns :].diagonal(dim1=-2, dim2=-1).fill_(-2.0)
    return float((cos > threshold).any(-1).float().mean())


def test_real_keys_are_the_models_captured_once_and_hold_near_duplicates() -> None:
    before = set((cache_root() / "bench-keys").glob("*.pt"))
    made = captured(4, 128, 700)
    after = set((cache_root() / "bench-keys").glob("*.pt"))
    assert made.keys.shape == made.values.shape == (4, 700, 128)
    assert len(after - before) <= 1 and after  # one file for this shape (none new if an earlier test made it)
    again = captured(4, 128, 700)  # read back from the file
    assert torch.equal(again.keys, made.keys) and torch.equal(again.values, made.values)
    # a language model's keys: most rows have a near-duplicate among the newest 256 keys, on every head
    for head in range(4):
        assert matched_among_newest(made.keys[head : head + 1], 256) > 0.8, head
    drawn = torch.randn(1, 700, 128, generator=torch.Generator().manual_seed(0))
    assert matched_among_newest(drawn, 256) == 0.0  # random draws: none
    # two heads of one layer side by side: each half is a head of dim 64, which differ
    assert not torch.allclose(made.keys[0, :, :64], made.keys[0, :, 64:])


def test_shapes_real_keys_cannot_have_are_named() -> None:
    assert fits(8, 128, 4000) == ""
    assert "head dim 96" in fits(8, 96, 4000)
    assert "31 KV heads" in fits(31, 128, 4000)
    assert "9000 tokens" in fits(8, 128, 9000)


def test_bench_evict_times_random_and_real_keys_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = kvbench(
        *("bench", "evict", "--policy", "rkv-official", "--batch", "1", "--budget", "256", "--buffer", "32"),
        *("--min-time", "0.01", "--json", str(out)),
    )
    assert result.returncode == 0, result.stderr
    rows = {(r["keys"], r["policy"]): r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {(k, p) for k in ("random", "real") for p in ("random", "rkv-official")}
    assert "random keys ms" in result.stdout and "real keys ms" in result.stdout
    assert "real keys: smollm2-135m's keys on the fidelity probe's trace (1088 tokens" in result.stdout
    screen = json.loads(out.read_text())["machine"]["eviction_choices"]["near_duplicate_screen"]
    assert f"R-KV's near-duplicate screen multiplies in {screen}: " in result.stdout

"""TriAttention's query statistics: the math, the file format and the errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvbench.core.calibration import QueryStats, default_path
from kvbench.errors import PrerequisiteError


def test_statistics_are_the_complex_band_means() -> None:
    q = torch.randn(4, 30, 8)  # [Hq, T, D]
    stats = QueryStats.from_queries("m", "corpus", [q, q * 2])
    z = torch.complex(q[..., :4], q[..., 4:])  # band f pairs dims f and f + D/2
    assert torch.allclose(stats.mean[0], z.mean(dim=1))
    assert torch.allclose(stats.mean_abs[1], (2 * z).abs().mean(dim=1))
    assert stats.tokens == 30 and stats.mean.shape == (2, 4, 4)


def test_save_and_load_round_trip_keyed_by_model(tmp_path: Path) -> None:
    stats = QueryStats.from_queries("smollm2-135m", "synthetic prose", [torch.randn(3, 10, 6)])
    path = default_path("smollm2-135m", tmp_path)
    stats.save(path)
    loaded = QueryStats.load(path, model="smollm2-135m")
    assert torch.equal(loaded.mean, stats.mean) and torch.equal(loaded.mean_abs, stats.mean_abs)
    assert (loaded.model, loaded.corpus, loaded.tokens) == ("smollm2-135m", "synthetic prose", 10)
    with pytest.raises(PrerequisiteError, match=r"not 'tiny-qwen3'.*kvbench calibrate --model tiny-qwen3"):
        QueryStats.load(path, model="tiny-qwen3")
    with pytest.raises(PrerequisiteError, match="no calibration statistics"):
        QueryStats.load(tmp_path / "missing.safetensors", model="x")

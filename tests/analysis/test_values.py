"""Value-state statistics on synthetic caches whose answers are known, computed again here by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvbench.analysis.values import layer_statistics, quantization_error, quantize_per_token

PLANTED = 57


def by_hand_dequantized(x: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Asymmetric per-token quantization, written out: each group's min maps to 0, its max to 2^b − 1."""
    groups = x.reshape(-1, group).double()
    low = groups.min(dim=1, keepdim=True).values
    step = (groups.max(dim=1, keepdim=True).values - low) / (2**bits - 1)
    levels = torch.clamp(torch.round((groups - low) / step), 0, 2**bits - 1)
    return (levels * step + low).reshape(x.shape)


@pytest.mark.parametrize(("bits", "group"), [(2, 8), (4, 16), (8, 32)])
def test_quantization_is_asymmetric_per_token_within_half_a_step(bits: int, group: int) -> None:
    x = torch.randn(3, 50, 32, generator=torch.Generator().manual_seed(bits)) * 2 + 0.7
    got = quantize_per_token(x, bits, group).double()
    expected = by_hand_dequantized(x, bits, group)
    groups = x.reshape(-1, group).double()
    step = ((groups.max(dim=1).values - groups.min(dim=1).values) / (2**bits - 1)).reshape(3, 50, -1)
    # the same levels as by hand (a rounding tie may fall either way: at most one step, on no more than a few)
    assert (got - expected).abs().max() <= step.max() * 1.0001
    assert ((got - expected).abs() > 1e-5).float().mean() < 0.001
    # every value within half a step of its group's step
    error = (got - x.double()).abs().reshape(3, 50, 32 // group, group)
    assert (error <= step[..., None] / 2 + 1e-5).all()
    # the error shrinks with the bits
    assert quantization_error(x, bits, group).mean() > quantization_error(x, min(bits + 2, 16), group).mean()


def test_a_group_that_does_not_divide_the_head_is_refused() -> None:
    with pytest.raises(ValueError, match="group size 12 does not divide the head dimension 32"):
        quantize_per_token(torch.zeros(2, 32), 4, 12)


@pytest.fixture(scope="module")
def planted() -> tuple[torch.Tensor, torch.Tensor, dict]:
    gen = torch.Generator().manual_seed(3)
    values = torch.randn(2, 200, 32, generator=gen) * 0.1
    values[0, PLANTED] *= 50  # one token with a huge range in head 0
    keys = torch.randn(2, 200, 32, generator=gen)
    stats = layer_statistics(0, keys, values, bits=(2, 4), group=32, above=4.0, position_bins=8)
    return keys, values, {(s.head, s.statistic): s.value for s in stats}


def test_the_planted_token_is_the_range_maximum_and_the_only_one_above_4x(planted) -> None:
    keys, values, stats = planted
    ranges = (values.max(dim=-1).values - values.min(dim=-1).values).numpy()
    assert stats[(0, "range_v_q1")] == pytest.approx(float(ranges[0, PLANTED]))
    assert stats[(0, "range_v_q0.5")] == pytest.approx(float(np.quantile(ranges[0], 0.5)))
    assert stats[(0, "range_v_share_above_4x_median")] == pytest.approx(1 / 200)
    assert stats[(1, "range_v_share_above_4x_median")] == 0.0
    key_ranges = (keys.max(dim=-1).values - keys.min(dim=-1).values).numpy()
    assert stats[(1, "range_k_q0.9")] == pytest.approx(float(np.quantile(key_ranges[1], 0.9)))
    # position 57 of 200 lies in the third of 8 bins (positions 50-74): that bin's mean carries it
    bin_mean = float(ranges[0, 50:75].mean())
    assert stats[(0, "range_v_mean_position_bin_2")] == pytest.approx(bin_mean)
    assert stats[(0, "range_v_mean_position_bin_2")] == max(
        stats[(0, f"range_v_mean_position_bin_{i}")] for i in range(8)
    )
    counts = [v for (head, name), v in stats.items() if head is None and name.endswith("_count")]
    assert sum(counts) == 2 * 200


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    return ranks


def test_correlations_are_pearson_and_spearman_of_range_and_error(planted) -> None:
    _, values, stats = planted
    ranges = (values.max(dim=-1).values - values.min(dim=-1).values).flatten().double().numpy()
    for bits in (2, 4):
        error = (values.double() - by_hand_dequantized(values, bits, 32)).pow(2).mean(dim=-1).sqrt()
        error = error.flatten().numpy()
        pearson = np.corrcoef(ranges, error)[0, 1]
        spearman = np.corrcoef(_ranks(ranges), _ranks(error))[0, 1]
        assert stats[(None, f"pearson_range_v_error_{bits}bit")] == pytest.approx(pearson, abs=1e-4)
        assert stats[(None, f"spearman_range_v_error_{bits}bit")] == pytest.approx(spearman, abs=1e-4)
        assert pearson > 0.9  # the planted token dominates both
    assert stats[(0, "quant_error_2bit_mean")] > stats[(1, "quant_error_2bit_mean")]

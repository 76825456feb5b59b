"""R-KV's near-duplicate search (kvbench.policies.near_duplicates) against the whole fp32 cosine matrix:
the same newest match for every row, whichever path the screen takes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvbench.policies.near_duplicates import (
    COLUMNS,
    NEWEST_COLUMNS,
    SCREEN_MARGIN,
    STRIP,
    newest_near_duplicates,
)


def brute_force(unit: torch.Tensor, threshold: float) -> torch.Tensor:
    n = unit.shape[1]
    cos = unit @ unit.mT
    cos.diagonal(dim1=-2, dim2=-1).fill_(-2.0)
    similar = cos > threshold
    return torch.where(similar.any(-1), n - 1 - similar.flip(-1).int().argmax(-1), -1)


def searched(unit: torch.Tensor, threshold: float) -> torch.Tensor:
    """The search's newest matches, after checking the cosines it returns with them."""
    newest, similarity = newest_near_duplicates(unit, threshold)
    found = newest >= 0
    expected = (unit * unit.gather(1, newest.clamp(min=0)[..., None].expand_as(unit))).sum(-1)
    assert torch.allclose(similarity[found], expected[found], atol=1e-6)
    assert torch.equal(similarity[~found], torch.zeros_like(similarity[~found]))
    return newest


def planted(n: int, dim: int, pairs: int, seed: int, cosines: tuple[float, float]) -> torch.Tensor:
    """Isotropic keys (no row matches among the newest columns, so the symmetric screen runs) with
    ``pairs`` older keys rewritten to a cosine drawn from ``cosines`` with another old key."""
    gen = torch.Generator().manual_seed(seed)
    unit = F.normalize(torch.randn(3, n, dim, generator=gen), dim=-1)
    older = n - NEWEST_COLUMNS - 1
    for group in range(3):
        for _ in range(pairs if older > 1 else 0):
            a, b = torch.randint(0, older, (2,), generator=gen).tolist()
            if a == b:
                continue
            noise = unit[group, b] - (unit[group, b] @ unit[group, a]) * unit[group, a]
            c = cosines[0] + (cosines[1] - cosines[0]) * torch.rand(1, generator=gen).item()
            unit[group, b] = c * unit[group, a] + (1 - c * c) ** 0.5 * F.normalize(noise, dim=0)
    return unit


@pytest.mark.parametrize("n", [1, 5, NEWEST_COLUMNS, NEWEST_COLUMNS + 1, 700, 2 * COLUMNS + NEWEST_COLUMNS])
def test_isotropic_keys_with_planted_pairs_around_the_threshold(n: int) -> None:
    unit = planted(n, 128, pairs=n // 10, seed=n, cosines=(0.45, 0.55))
    assert (brute_force(unit, 0.5) >= 0).any() or n < 100
    assert torch.equal(searched(unit, 0.5), brute_force(unit, 0.5))


@pytest.mark.parametrize("seed", range(4))
def test_a_few_pairs_among_strips_that_flag_nothing(seed: int) -> None:
    """Two planted pairs in 3.5 strips: most strips flag no block, and each pair's two rows are found
    through a strip's row maxima for one and its column maxima for the other."""
    unit = planted(3 * STRIP + STRIP // 2, 64, pairs=2, seed=seed, cosines=(0.6, 0.9))
    expected = brute_force(unit, 0.5)
    assert int((expected >= 0).sum()) >= 4
    assert torch.equal(searched(unit, 0.5), expected)


def test_pairs_closer_to_the_threshold_than_bf16_resolves() -> None:
    """Cosines within 1e-3 of the threshold: the screen must leave every one of them to fp32."""
    unit = planted(1200, 128, pairs=300, seed=7, cosines=(0.499, 0.501))
    expected = brute_force(unit, 0.5)
    assert int((expected >= 0).sum()) > 100
    assert torch.equal(searched(unit, 0.5), expected)


@pytest.mark.parametrize("threshold", [-0.2, 0.0, 0.01, 0.5, 0.9, 0.999])
def test_keys_where_most_rows_match_among_the_newest(threshold: float) -> None:
    """A shared direction, as a language model's keys have: most rows find a match in the newest
    columns and the rest search the screened blocks one by one."""
    gen = torch.Generator().manual_seed(1)
    shared = torch.linspace(0, 3, 900)[:, None] * torch.randn(32, generator=gen)
    keys = torch.randn(2, 900, 32, generator=gen) + shared
    unit = F.normalize(keys, dim=-1)
    assert torch.equal(searched(unit, threshold), brute_force(unit, threshold))


def test_exact_duplicates_and_zero_keys() -> None:
    gen = torch.Generator().manual_seed(2)
    unit = F.normalize(torch.randn(2, 60, 16, generator=gen), dim=-1).repeat(1, 12, 1)  # each key 12 times
    unit[:, 100:110] = 0.0
    assert torch.equal(searched(unit, 0.5), brute_force(unit, 0.5))


@pytest.mark.parametrize("dim", [4, 64, 128])
def test_the_bf16_screen_stays_within_its_margin(dim: int) -> None:
    """The screen's guarantee: a bf16 product of unit vectors is within SCREEN_MARGIN of the fp32 one."""
    gen = torch.Generator().manual_seed(dim)
    shared = torch.randn(dim, generator=gen)
    unit = F.normalize(torch.randn(4, 1000, dim, generator=gen) + shared, dim=-1)
    coarse = (unit.bfloat16() @ unit.bfloat16().mT).float()
    assert float((coarse - unit @ unit.mT).abs().max()) < SCREEN_MARGIN / 2

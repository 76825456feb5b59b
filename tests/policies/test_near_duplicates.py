"""R-KV's near-duplicate search (kvbench.policies.near_duplicates) against the whole fp32 cosine matrix:
the same newest match for every row, whichever path the screen takes and whichever dtype it screens in
(the machine's choice, kvbench.core.hardware: bf16 or fp32)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvbench.core import hardware
from kvbench.policies import near_duplicates
from kvbench.policies.near_duplicates import (
    COLUMNS,
    NEWEST_COLUMNS,
    SCREEN_MARGINS,
    newest_near_duplicates,
)
from kvbench.policies.rkv_official import thresholded_redundancy


@pytest.fixture(params=[torch.bfloat16, torch.float32], ids=["bf16-screen", "fp32-screen"], autouse=True)
def screen(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> torch.dtype:
    """Every test here runs with each screen dtype, as each kind of machine chooses it."""
    name = {torch.bfloat16: "bfloat16", torch.float32: "float32"}[request.param]
    monkeypatch.setenv(hardware.FORCE_SCREEN, name)
    hardware._screen.cache_clear()
    yield request.param
    hardware._screen.cache_clear()


def brute_force(unit: torch.Tensor, threshold: float) -> torch.Tensor:
    n = unit.shape[1]
    cos = unit @ unit.mT
    cos.diagonal(dim1=-2, dim2=-1).fill_(-2.0)
    similar = cos > threshold
    return torch.where(similar.any(-1), n - 1 - similar.flip(-1).int().argmax(-1), -1)


def searched(unit: torch.Tensor, threshold: float, strip: int | None = None) -> torch.Tensor:
    """The search's newest matches, after checking the cosines it returns with them."""
    newest, similarity = newest_near_duplicates(unit, threshold, strip=strip)  # in the fixture's dtype
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
@pytest.mark.parametrize("strip", hardware.STRIPS)
def test_a_few_pairs_among_strips_that_flag_nothing(seed: int, strip: int) -> None:
    """Two planted pairs in 3.5 strips of each width a machine may choose: most strips flag no block, and
    each pair's two rows are found through a strip's row maxima for one and its column maxima for the
    other."""
    unit = planted(3 * strip + strip // 2, 64, pairs=2, seed=seed, cosines=(0.6, 0.9))
    expected = brute_force(unit, 0.5)
    assert int((expected >= 0).sum()) >= 4
    assert torch.equal(searched(unit, 0.5, strip), expected)


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
def test_the_screen_stays_within_its_margin(dim: int, screen: torch.dtype) -> None:
    """The screen's guarantee: a product of unit vectors in the screen's dtype is within its margin of the
    exact one."""
    gen = torch.Generator().manual_seed(dim)
    shared = torch.randn(dim, generator=gen)
    unit = F.normalize(torch.randn(4, 1000, dim, generator=gen) + shared, dim=-1)
    coarse = (unit.to(screen) @ unit.to(screen).mT).double()
    assert float((coarse - unit.double() @ unit.double().mT).abs().max()) < SCREEN_MARGINS[screen] / 2


def test_the_machines_choice_never_changes_what_rkv_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    """R-KV's redundancy, as its policy computes it, with the screen in bf16 and in fp32 and in each strip
    width a machine may choose: equal, on keys with a shared direction (most rows match among the newest)
    and on isotropic keys with planted pairs (the symmetric screen, strip by strip)."""
    gen = torch.Generator().manual_seed(3)
    shared = torch.linspace(0, 2, 1500)[:, None] * torch.randn(64, generator=gen)
    keys = torch.randn(2, 3, 1500, 64, generator=gen) + shared
    keys[:, :, 700:760] = keys[:, :, 100:160] + 1e-3 * torch.randn(2, 3, 60, 64, generator=gen)
    isotropic = planted(1500, 64, pairs=40, seed=5, cosines=(0.45, 0.7))[None]
    for case in (keys, isotropic):
        found = {}
        for name in ("bfloat16", "float32"):
            for strip in hardware.STRIPS:
                monkeypatch.setenv(hardware.FORCE_SCREEN, name)
                monkeypatch.setattr(near_duplicates, "screen_strip", lambda device, strip=strip: strip)
                hardware._screen.cache_clear()
                found[name, strip] = thresholded_redundancy(case, 0.5)
        first = found["float32", 512]
        assert all(torch.equal(first, other) for other in found.values())
        assert float(first.std()) > 0  # it found different redundancy on different keys

"""The statistics' edge cases a table meets: empty and single-problem cells, unshared problems, all ties,
p-values at the level and Holm's cap; each found by a surviving mutant of `make mutants`."""

from __future__ import annotations

import math

import pytest

from kvbench.results.stats import (
    Estimate,
    PairedComparison,
    bootstrap_mean,
    compare_arms,
    holm,
    paired_difference,
    resolvable_difference,
    verdicts,
)


def test_an_empty_cell_is_nan_with_no_problems() -> None:
    empty = bootstrap_mean([])
    assert math.isnan(empty.value) and math.isnan(empty.low) and math.isnan(empty.high)
    assert empty.problems == 0


def test_a_single_problem_is_its_own_estimate() -> None:
    assert bootstrap_mean([0.25]) == Estimate(0.25, 0.25, 0.25, 1)


def test_paired_difference_is_arm_minus_other_on_shared_problems_only() -> None:
    arm = {"a": 1.0, "b": 0.5, "only-arm": 9.0}
    other = {"a": 0.25, "b": 0.75, "only-other": -9.0}
    difference = paired_difference(arm, other, draws=200)
    assert difference.value == pytest.approx(((1.0 - 0.25) + (0.5 - 0.75)) / 2)
    assert difference.problems == 2


def test_all_ties_give_p_one_and_no_verdict() -> None:
    tied = compare_arms({"a": 1.0, "b": 0.0}, {"a": 1.0, "b": 0.0}, draws=200)
    assert (tied.wins, tied.ties, tied.losses, tied.p_value) == (0, 2, 0, 1.0)
    (verdict,) = verdicts([tied])
    assert (verdict.p_adjusted, verdict.verdict) == (1.0, "inconclusive")  # no margin: no equivalence


def test_holm_never_exceeds_one() -> None:
    assert holm([0.6, 0.7, 0.9]) == [1.0, 1.0, 1.0]
    assert holm([0.01, 0.04, 0.3]) == pytest.approx([0.03, 0.08, 0.3])


def _with_p(p: float, wins: int, losses: int) -> PairedComparison:
    """A comparison whose sign test and mean test (on a mean of the sign of wins − losses) both give p."""
    mean = 0.1 if wins > losses else -0.1
    return PairedComparison(Estimate(mean, mean - 0.05, mean + 0.05, 10), wins, 0, losses, p, (), p_mean=p)


def test_a_p_value_at_the_level_is_not_significant() -> None:
    at, below = verdicts([_with_p(0.05, 8, 2)])[0], verdicts([_with_p(0.0499, 8, 2)])[0]
    assert (at.verdict, below.verdict) == ("inconclusive", "beats null")
    assert verdicts([_with_p(0.0499, 2, 8)])[0].verdict == "loses to null"


def test_one_problem_can_resolve_nothing() -> None:
    assert resolvable_difference(1) == 0.5  # a sign test on one problem never reaches 5%
    assert math.isnan(resolvable_difference(0))


def test_the_bootstrap_is_reproducible_by_default() -> None:
    values = [0.1, 0.9, 0.4, 0.7, 0.3]
    assert bootstrap_mean(values) == bootstrap_mean(values)


@pytest.mark.parametrize("problems", [10, 30, 60])
def test_the_power_note_matches_the_exact_two_sided_sign_test(problems: int) -> None:
    """The smallest win-rate excess (on a 0.005 grid) at which scipy's own two-sided binomtest rejects
    with probability >= 80%, computed by summing binomial probabilities over its rejection region."""
    from scipy.stats import binom, binomtest

    reject = [k for k in range(problems + 1) if binomtest(k, problems, 0.5).pvalue < 0.05]
    expected = next(
        e / 1000
        for e in range(0, 501, 5)
        if sum(binom.pmf(k, problems, 0.5 + e / 1000) for k in reject if k > problems / 2) >= 0.8
    )
    assert resolvable_difference(problems) == pytest.approx(expected)


@pytest.mark.parametrize("cap", [2**23, 0])  # the shared resamples, and those redrawn past the cap
def test_the_bootstrap_resamples_problems_with_replacement_as_drawn(monkeypatch, cap: int) -> None:
    import numpy as np

    from kvbench.results import stats

    monkeypatch.setattr(stats, "CACHED_RESAMPLES", cap)
    values = np.random.default_rng(11).random(37)
    picks = np.random.default_rng(stats.SEED).integers(0, values.size, size=(stats.DRAWS, values.size))
    low, high = np.percentile(values[picks].mean(axis=1), [2.5, 97.5])
    for _ in range(2):  # the second call reads the cache
        estimate = stats.bootstrap_mean(values)
        assert (estimate.low, estimate.high) == pytest.approx((low, high), abs=1e-12)
        assert estimate.value == values.mean()

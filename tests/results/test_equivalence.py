"""The four verdicts on constructed paired data, with their p-values written out independently, and the
sign test's power figures (problems needed, minimum detectable effect) checked against simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from exact_by_hand import tost_by_hand
from scipy.stats import binom, binomtest

from kvbench.results.stats import (
    compare_arms,
    minimum_detectable_effect,
    sign_test_power,
    sign_test_problems,
    verdicts,
)

MARGIN = 0.1


def arms(wins: int, ties: int, losses: int) -> tuple[dict[str, float], dict[str, float]]:
    """One pass/fail sample per problem: the arm wins, ties (both right) or loses each problem."""
    outcomes = [1.0] * wins + [0.0] * ties + [-1.0] * losses
    arm = {f"p{i}": max(o, 0.0) + (o == 0.0) for i, o in enumerate(outcomes)}
    null = {f"p{i}": max(-o, 0.0) + (o == 0.0) for i, o in enumerate(outcomes)}
    return arm, null


def verdict(wins: int, ties: int, losses: int, margin: float = MARGIN):
    return verdicts([compare_arms(*arms(wins, ties, losses), margin, draws=200)])[0]


def test_beats_and_loses_follow_the_exact_sign_test() -> None:
    beats, loses = verdict(10, 0, 0), verdict(0, 0, 10)
    assert beats.p_value == loses.p_value == pytest.approx(2 * 0.5**10, rel=1e-12)
    assert (beats.verdict, loses.verdict) == ("beats null", "loses to null")


def test_the_same_rates_are_inconclusive_on_4_problems_and_equivalent_on_400() -> None:
    small, large = verdict(1, 2, 1), verdict(100, 200, 100)  # half the problems differ, evenly
    assert small.p_value == large.p_value == 1.0
    assert small.p_equivalence == pytest.approx(tost_by_hand(1, 2, 1, MARGIN), rel=1e-3)
    assert large.p_equivalence == pytest.approx(tost_by_hand(100, 200, 100, MARGIN), rel=1e-3)
    assert small.p_equivalence > 0.4 and large.p_equivalence < 0.01
    assert (small.verdict, large.verdict) == ("inconclusive", "equivalent to null")
    # beside "inconclusive": it wins as often as it loses, with a mean inside the margin, so what would
    # decide is the equivalence test (its figure is checked by simulation in test_power_plan.py)
    assert small.discordance == large.discordance == 0.5
    assert small.plan is not None and small.plan.decision == "equivalent to null"
    assert small.problems_needed is not None and 4 < small.problems_needed < 1000


def test_a_difference_near_the_margin_is_inconclusive() -> None:
    # 17 wins, 10 losses, 73 ties: mean 0.07 inside ±0.1, but its 90% interval reaches past 0.1
    near = verdict(17, 73, 10)
    assert near.p_equivalence == pytest.approx(tost_by_hand(17, 73, 10, MARGIN), rel=1e-3)
    assert near.p_value == pytest.approx(binomtest(17, 27).pvalue, rel=1e-12)
    assert near.p_value > 0.05 and near.p_equivalence > 0.05 and near.verdict == "inconclusive"
    # significant and shown inside the margin: it differs from the null, by less than the margin
    assert verdict(55, 920, 25).verdict == "practically equivalent"


def test_identical_arms_need_enough_problems_to_be_equivalent() -> None:
    """Every problem tied has probability up to (1 - margin)^n at the margin: the p-value is never
    below it (149 problems at 0.02), and is the enumerated exact test's."""
    few, many = verdict(0, 4, 0, 0.02), verdict(0, 400, 0, 0.02)
    assert few.p_equivalence >= 0.98**4 and many.p_equivalence >= 0.98**400
    assert few.p_equivalence == pytest.approx(tost_by_hand(0, 4, 0, 0.02), rel=1e-3)
    assert many.p_equivalence == pytest.approx(tost_by_hand(0, 400, 0, 0.02), rel=1e-3)
    assert (few.verdict, many.verdict) == ("inconclusive", "equivalent to null")


def test_equivalence_is_holm_corrected_across_a_table() -> None:
    one = compare_arms(*arms(100, 200, 100), MARGIN, draws=200)
    shifted = compare_arms(*arms(106, 200, 94), MARGIN, draws=200)  # mean 0.03
    alone = verdicts([shifted])[0]
    together = verdicts([one, shifted])
    raw = sorted([one.p_equivalence, shifted.p_equivalence])
    holm = [2 * raw[0], max(2 * raw[0], raw[1])]
    assert sorted(v.p_equivalence_adjusted for v in together) == pytest.approx(holm, rel=1e-12)
    assert alone.p_equivalence_adjusted == pytest.approx(shifted.p_equivalence, rel=1e-12)


def test_without_a_margin_nothing_is_equivalent() -> None:
    assert verdict(100, 200, 100, math.nan).verdict == "inconclusive"
    assert compare_arms(*arms(1, 2, 1)).problems_needed is None


def _simulated_power(problems: int, discordance: float, effect: float, draws: int, seed: int) -> float:
    """Draws of (wins, ties, losses) over ``problems``; scipy's binomtest decides each."""
    win, loss = (discordance + effect) / 2, (discordance - effect) / 2
    counts = np.random.default_rng(seed).multinomial(problems, [win, 1 - discordance, loss], size=draws)
    decided: dict[tuple[int, int], bool] = {}
    rejected = 0
    for w, _, lost in counts:
        key = (int(w), int(lost))
        if key not in decided:
            decided[key] = w > lost and binomtest(key[0], key[0] + key[1], 0.5).pvalue < 0.05
        rejected += decided[key]
    return rejected / draws


@pytest.mark.parametrize(("discordance", "effect"), [(0.5, 0.1), (0.3, 0.05), (0.02, 0.02)])
def test_the_sign_tests_problems_give_80_percent_power_in_10000_simulated_draws(
    discordance: float, effect: float
) -> None:
    needed = sign_test_problems(discordance, effect)
    assert needed is not None
    analytic = sign_test_power(needed, discordance, effect)
    simulated = _simulated_power(needed, discordance, effect, draws=10_000, seed=7)
    assert abs(simulated - analytic) < 0.01
    assert analytic >= 0.8 and simulated > 0.79
    assert sign_test_power(needed // 2, discordance, effect) < 0.8  # and it is not a loose figure


@pytest.mark.parametrize(("problems", "discordance"), [(30, 1.0), (60, 0.4), (400, 0.5)])
def test_the_minimum_detectable_effect_is_detected_80_percent_of_the_time(
    problems: int, discordance: float
) -> None:
    effect = minimum_detectable_effect(problems, discordance)
    assert 0 < effect < discordance
    # the power at that effect, summed over scipy's own rejection regions: of k differing problems, the
    # wins above k/2 that binomtest rejects are those from its fewest rejected count up (p falls with w)
    win = 0.5 + effect / (2 * discordance)
    power = sum(
        binom.pmf(k, problems, discordance) * binom.sf(_fewest_rejected_by_binomtest(k) - 1, k, win)
        for k in range(problems + 1)
    )
    assert power == pytest.approx(0.8, abs=1e-4)


def _fewest_rejected_by_binomtest(differing: int) -> int:
    """The fewest wins above half of ``differing`` that scipy's binomtest rejects at 5% (differing + 1
    when none is), by bisection."""
    low, high = differing // 2, differing + 1  # low is never rejected; high stands for "none"
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if binomtest(middle, differing).pvalue < 0.05 else (middle, high)
    return high


@pytest.mark.parametrize(("problems", "discordance", "effect"), [(5000, 0.3, 0.02), (20_000, 0.9, 0.02)])
def test_the_power_sum_left_out_only_the_binomial_tails(
    problems: int, discordance: float, effect: float
) -> None:
    """Every count of differing problems summed, each with its exact rejection region: the same power
    to 1e-11 (sign_test_power sums only the counts with more than 1e-12 of the mass)."""
    counts = np.arange(problems + 1)
    critical = _fewest_rejected_wins(counts)
    rejects = np.where(
        critical <= counts, binom.sf(critical - 1, counts, 0.5 + effect / (2 * discordance)), 0.0
    )
    full = float(binom.pmf(counts, problems, discordance) @ rejects)
    assert 0.01 < full < 0.99
    assert sign_test_power(problems, discordance, effect) == pytest.approx(full, abs=1e-11)


def _fewest_rejected_wins(differing: np.ndarray) -> np.ndarray:
    """For each count of differing problems, the fewest wins whose two-sided p (twice the upper tail)
    is under 5%, found by stepping up from the median."""
    wins = differing // 2
    for _ in range(int(differing.max()) + 2):
        short = (2 * binom.sf(wins - 1, differing, 0.5) >= 0.05) & (wins <= differing)
        if not short.any():
            return wins
        wins = wins + short
    raise AssertionError("no rejection region found")


def test_four_problems_can_detect_nothing() -> None:
    assert minimum_detectable_effect(4, 0.5) == math.inf
    assert minimum_detectable_effect(4, 1.0) == math.inf  # 4 of 4 wins: p = 0.125
    assert math.isnan(minimum_detectable_effect(0, 0.5))


def test_calibration_tallies_verdicts_with_a_clopper_pearson_interval() -> None:
    from scipy.stats import beta

    from kvbench.results.stats import calibration

    # 1 false positive; only the 2 comparisons with 6 or more differing problems can reject at all
    judged = [verdict(10, 0, 0)] + [verdict(1, 2, 1)] * 28 + [verdict(100, 200, 100)]
    result = calibration(judged)
    assert result.verdicts == {
        "beats null": 1,
        "practically equivalent": 0,
        "equivalent to null": 1,
        "inconclusive": 28,
        "loses to null": 0,
    }
    assert result.testable == 2 and result.false_positive_rate == pytest.approx(1 / 2)
    # Clopper-Pearson written out: beta quantiles at 2.5% and 97.5%
    assert (result.low, result.high) == pytest.approx(
        (beta.ppf(0.025, 1, 2), beta.ppf(0.975, 2, 1)), rel=1e-9
    )

    # the attainable levels, summed from scipy's binomial: the rejection regions at 10 and 200 differing
    def level(m: int) -> float:
        return sum(binom.pmf(w, m, 0.5) for w in range(m + 1) if binomtest(w, m).pvalue < 0.05)

    assert result.levels[1] == 0.0 and result.expected == pytest.approx(level(10) + level(200), rel=1e-9)
    covered = sum(j.difference.low <= 0 <= j.difference.high for j in judged) / 30
    assert result.covered == covered and covered < 1  # the all-wins cell's interval misses 0


def test_a_margin_that_needs_more_than_max_problems_is_out_of_reach() -> None:
    """MAX_PROBLEMS promises None beyond it; the doubling search once overshot to 2^20 and bisected there,
    returning a figure above the cap (1,031,002 problems for a margin of 0.00276 at discordance 1)."""
    from kvbench.results.stats import MAX_PROBLEMS

    assert sign_test_problems(1.0, 0.00285) <= MAX_PROBLEMS  # just under the cap: still a figure
    assert sign_test_problems(1.0, 0.00276) is None

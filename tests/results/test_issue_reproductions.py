"""The audit's reproductions, each with the value a reader sees: a verdict, an interval, a tie. Every
figure the checks lean on is computed here apart from kvbench (scipy's binomial, the data written out)."""

from __future__ import annotations

import numpy as np
from scipy.stats import binom, binomtest

from kvbench.results.compare import plus_minus
from kvbench.results.stats import compare_arms, verdicts

MARGIN = 0.02


def judged(deltas: list[float], margin: float = MARGIN, base: float = 0.5):
    """An arm whose per-problem scores are the null's (``base``) plus ``deltas``."""
    arm = {f"p{i}": base + d for i, d in enumerate(deltas)}
    null = {f"p{i}": base for i in range(len(deltas))}
    return verdicts([compare_arms(arm, null, margin)])[0]


def test_nine_small_wins_and_one_large_loss_do_not_beat_the_null() -> None:
    """9 of 10 problems won (the sign test's p is 0.0215) while the mean difference is −0.041: the
    verdict must not say *beats* beside a negative Δ."""
    c = judged([0.01] * 9 + [-0.5])
    assert binomtest(9, 10).pvalue < 0.05 and np.mean([0.01] * 9 + [-0.5]) < 0
    assert c.p_value < 0.05 and c.difference.value < 0
    assert c.verdict == "inconclusive"
    assert c.difference.low <= 0 <= c.difference.high  # the interval shown agrees


def test_twelve_tiny_wins_are_not_a_plain_beats() -> None:
    """Twelve wins of +0.001, far inside ±0.02: never a bare *beats null* — with 12 problems nothing
    can show that a rare large failure is absent, and +0.001 on every problem is no evidence of a mean
    above 0 for a metric that could fail by 1 on an unseen problem: at most (1/1.001)^12 = 0.988."""
    c = judged([0.001] * 12)
    assert c.wins == 12 and c.p_value < 0.001
    assert c.verdict != "beats null"
    assert c.p_mean >= min(1.0, 2 * (1 / 1.001) ** 12) - 1e-9


def test_a_tiny_win_on_enough_problems_is_practically_equivalent() -> None:
    """Wins of about +0.001 on 60 problems: the difference is real and shown inside the margin."""
    rng = np.random.default_rng(49)
    c = judged(list(0.001 + 0.0002 * rng.standard_normal(60)))
    assert c.wins == 60
    assert c.verdict == "practically equivalent"
    assert c.difference.low > -MARGIN and c.difference.high < MARGIN


def test_scores_equal_up_to_rounding_are_a_tie() -> None:
    assert 0.1 + 0.2 != 0.3
    c = verdicts([compare_arms({"a": 0.1 + 0.2, "b": 1.0}, {"a": 0.3, "b": 1.0}, MARGIN)])[0]
    assert (c.wins, c.ties, c.losses) == (0, 2, 0)


def test_one_win_among_150_pass_fail_problems_is_not_equivalent() -> None:
    """150 problems, one won, 149 tied: were the arms 0.02 apart with every differing problem a win,
    one win or fewer in 150 has probability binom.cdf(1, 150, 0.02) = 0.196 — far above α."""
    arm = {i: 1.0 if i == 0 else 0.0 for i in range(150)}
    null = dict.fromkeys(range(150), 0.0)
    c = verdicts([compare_arms(arm, null, MARGIN)])[0]
    assert c.verdict == "inconclusive"
    assert c.p_equivalence >= binom.cdf(1, 150, MARGIN) - 1e-9
    assert c.method == "exact"


def test_the_rare_failure_policy_is_not_equivalent_on_four_problems() -> None:
    """A policy that matches the null up to noise and fails by 0.2 on one problem in ten: four problems
    that happen to show no failure are never *equivalent* (the mean is −0.02, on the margin)."""
    c = judged([0.0004, -0.0011, 0.0007, 0.0002])
    assert c.verdict == "inconclusive" and c.p_equivalence == 1.0


def test_no_differing_problem_is_said_not_shown_as_a_zero_interval() -> None:
    """Every problem tied: the interval is the exact bound for four equal differences of a [0, 1]
    metric (|Δ| ≤ 1 − 0.025^(1/4) = 0.602), never "± 0.000"."""
    c = judged([0.0] * 4)
    bound = 1 - 0.025 ** (1 / 4)
    assert np.allclose((c.difference.low, c.difference.high), (-bound, bound))
    shown = plus_minus(c.difference.value, c.difference.low, c.difference.high, signed=True)
    assert shown != "+0.000 ± 0.000"


def test_the_interval_covers_a_normal_mean_at_four_and_eight_problems() -> None:
    """The percentile bootstrap covered 79% at n = 4 and 88% at n = 8; the shown interval must cover
    at least 93% (400 replicates each: 3 standard errors of 95% is 3.3 points)."""
    rng = np.random.default_rng(4908)
    for n in (4, 8):
        hits = 0
        for _ in range(400):
            c = judged(list(0.02 * rng.standard_normal(n)))
            hits += c.difference.low <= 0 <= c.difference.high
        assert hits / 400 >= 0.93 - 0.033, (n, hits)

"""Statistics against independent computations: scipy's bootstrap, hand-counted binomial tails, simulation."""

from __future__ import annotations

import random
from math import comb

import numpy as np
import pytest
from scipy import stats as scipy_stats

from kvbench.results.stats import bootstrap_mean, compare_arms, holm, pool, resolvable_difference, verdicts


def test_bootstrap_ci_agrees_with_scipy() -> None:
    values = np.random.default_rng(3).normal(0.4, 0.2, size=60)
    ours = bootstrap_mean(values, draws=20_000, seed=1)
    theirs = scipy_stats.bootstrap(
        (values,), np.mean, n_resamples=20_000, method="percentile", random_state=np.random.default_rng(1)
    ).confidence_interval
    assert ours.value == pytest.approx(values.mean())
    # the same generator draws the same resamples: the intervals agree to rounding, so a 90% interval
    # (about 0.008 narrower on each side here) cannot pass for a 95% one
    assert ours.low == pytest.approx(theirs.low, abs=1e-12) and ours.high == pytest.approx(
        theirs.high, abs=1e-12
    )
    narrower = bootstrap_mean(values, draws=20_000, seed=1, level=0.90)
    assert theirs.low - narrower.low < -1e-3 and narrower.high - theirs.high < -1e-3


def test_sign_test_equals_hand_counted_binomial_tails() -> None:
    arm = {f"p{i}": 1.0 for i in range(9)} | {"p9": 0.0, "p10": 0.5, "p11": 0.5}
    base = {f"p{i}": 0.0 for i in range(9)} | {"p9": 1.0, "p10": 0.5, "p11": 0.5}
    result = compare_arms(arm, base, draws=1000)
    assert (result.wins, result.ties, result.losses) == (9, 2, 1)
    # two-sided exact: P(X >= 9) + P(X <= 1) for X ~ Binomial(10, 1/2)
    tail = sum(comb(10, k) for k in (0, 1, 9, 10)) / 2**10
    assert result.p_value == pytest.approx(tail)


def test_pairing_is_by_problem_id_and_missing_problems_are_reported() -> None:
    arm = {"a": 1.0, "b": 0.0, "c": 1.0, "only-here": 1.0}
    base = {"c": 0.0, "b": 0.0, "a": 0.0}
    shuffled_arm = dict(random.Random(0).sample(list(arm.items()), len(arm)))
    first, second = compare_arms(arm, base, draws=500), compare_arms(shuffled_arm, base, draws=500)
    assert first == second
    assert first.excluded == ("only-here",) and first.difference.problems == 3


def test_holm_matches_its_definition() -> None:
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5]


def _simulate(win_rate: float, problems: int, seed: int) -> str:
    """An arm that wins each problem against the null with probability ``win_rate`` (no ties)."""
    rng = np.random.default_rng(seed)
    wins = rng.random(problems) < win_rate
    arm = {f"p{i}": float(w) for i, w in enumerate(wins)}
    null = {f"p{i}": float(not w) for i, w in enumerate(wins)}
    return verdicts([compare_arms(arm, null, draws=200)])[0].verdict


def test_a_known_difference_is_detected_at_the_stated_power() -> None:
    problems = 60
    excess = resolvable_difference(problems)  # the effect the power note says is detected 80% of the time
    detected = np.mean([_simulate(0.5 + excess, problems, seed) == "beats null" for seed in range(400)])
    assert 0.74 < detected < 0.9


def test_equal_arms_are_called_different_at_about_the_nominal_rate() -> None:
    false_alarms = np.mean(
        [_simulate(0.5, 60, seed) in ("beats null", "loses to null") for seed in range(1000)]
    )
    assert false_alarms < 0.06  # the exact sign test holds its 5% level (it is conservative)
    assert false_alarms > 0.01  # and it is not vacuous


def test_power_note() -> None:
    assert 0.2 < resolvable_difference(30) < 0.35  # 30 problems resolve only large win-rate excesses
    assert resolvable_difference(500) < resolvable_difference(30)


def test_pooled_tasks_cluster_by_task_and_problem() -> None:
    aime = {"1": 1.0, "2": 0.0, "3": 0.5}
    hmmt = {"1": 0.0, "2": 0.25}
    pooled = pool({"aime25": aime, "hmmt25": hmmt})
    assert len(pooled) == 5  # equal ids in two tasks stay two problems
    values = np.array([1.0, 0.0, 0.5, 0.0, 0.25])
    assert bootstrap_mean(list(pooled.values())) == bootstrap_mean(values)
    other = pool({"aime25": {"1": 0.0, "2": 0.0, "3": 0.5}, "hmmt25": {"1": 0.0}})
    test = compare_arms(pooled, other)
    assert (test.wins, test.ties, test.losses) == (1, 3, 0) and test.excluded == (("hmmt25", "2"),)

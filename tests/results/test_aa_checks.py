"""The A/A checks of `kvbench calibrate-null` on data whose truth is known: the pooled exchangeability
test rejects exchangeable seeds at most α of the time and finds one seed that sits apart; the injected
shift moves the true difference onto the margin (exactly, or in expectation for pass/fail scores) and
counts only the pairs that can declare equivalence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from kvbench.results.aa import _moved, injected_shift, seed_exchangeability
from kvbench.results.stats import ALPHA

DATASETS = 400
"""Exchangeable datasets: 3 standard errors of a 5% rate are 3.3 points."""


def seeds_of(rng: np.random.Generator, *, problems: int, seeds: int, apart: float = 0.0) -> list[dict]:
    """One cell: each problem's own level, every seed's score that level plus noise; the first seed
    ``apart`` higher on every problem."""
    level = rng.random(problems)
    return [
        {
            f"p{i}": float(level[i] + 0.05 * rng.standard_normal() + (apart if s == 0 else 0.0))
            for i in range(problems)
        }
        for s in range(seeds)
    ]


def test_exchangeable_seeds_are_rejected_at_most_alpha_of_the_time() -> None:
    rng = np.random.default_rng(4949)
    rejected = 0
    for _ in range(DATASETS):
        cells = {"a": seeds_of(rng, problems=8, seeds=10), "b": seeds_of(rng, problems=30, seeds=6)}
        rejected += seed_exchangeability(cells, draws=199, seed=int(rng.integers(1 << 30))).p_value <= ALPHA
    bound = ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / DATASETS)
    assert rejected / DATASETS <= bound, rejected


def test_a_seed_that_sits_apart_is_found_in_the_pooled_test() -> None:
    rng = np.random.default_rng(7)
    cells = {"a": seeds_of(rng, problems=8, seeds=10, apart=0.1), "b": seeds_of(rng, problems=30, seeds=6)}
    found = seed_exchangeability(cells, draws=999)
    assert found.p_value < 0.01 and found.cells["a"] < 0.01
    assert found.seeds == 10


def test_a_cell_the_seeds_never_change_carries_no_information() -> None:
    same = [dict.fromkeys(("p0", "p1", "p2"), 0.5)] * 4
    assert math.isnan(seed_exchangeability({"tied": same}, draws=99).p_value)


def test_a_pass_fail_shift_moves_the_mean_by_the_margin_in_expectation() -> None:
    """Each failure becomes a pass with probability margin·n/failures: the number moved is binomial with
    mean margin·n (here 149 scores, 100 of them failures, margin 0.02: 2.98 of them)."""
    values = np.array([1.0] * 49 + [0.0] * 100)
    rng = np.random.default_rng(0)
    moves = np.array([(_moved(values, 0.02, 1, True, rng) - values).sum() for _ in range(20_000)])
    chance = 0.02 * 149 / 100
    assert moves.mean() == pytest.approx(
        100 * chance, abs=4 * math.sqrt(100 * chance * (1 - chance) / 20_000)
    )
    assert (moves >= 0).all() and np.mean(moves == 0) == pytest.approx(binom.pmf(0, 100, chance), abs=0.01)
    # downward, every pass is a candidate; too few to move (all passes upward) is no injection at all
    assert (_moved(values, 0.02, -1, True, rng) <= values).all()
    assert _moved(np.ones(10), 0.02, 1, True, rng) is None


def test_only_pairs_that_can_declare_equivalence_are_counted() -> None:
    rng = np.random.default_rng(3)

    def pair(problems: int, margin: float) -> tuple[dict, dict, float]:
        a = {f"p{i}": float(0.5 + 0.01 * rng.standard_normal()) for i in range(problems)}
        b = {f"p{i}": float(0.5 + 0.01 * rng.standard_normal()) for i in range(problems)}
        return a, b, margin

    # 29 problems (under the bootstrap-t's 30) and no margin: neither counted
    found = injected_shift([pair(29, 0.02), pair(40, math.nan), pair(40, 0.02), pair(40, 0.02)])
    assert (found.comparisons, found.left_out) == (2, 2)
    # well-behaved differences with the true difference moved onto the margin: at most α equivalent
    pairs = [pair(40, 0.02) for _ in range(200)]
    found = injected_shift(pairs)
    assert found.comparisons == 200
    assert found.rate <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / 200), found
    # unshifted, the same pairs are equivalent nearly always: the count is not 0 by construction
    from kvbench.results.stats import compare_arms, verdicts

    unshifted = [verdicts([compare_arms(a, b, margin)])[0].verdict for a, b, margin in pairs[:20]]
    assert unshifted.count("equivalent to null") >= 15

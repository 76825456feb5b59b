"""What A/A runs of the null can show beyond a false-positive count (`kvbench calibrate-null`).

**Exchangeability of the seeds.** The A/A comparisons assume that the null at one protocol seed is a
draw like any other: for each problem, its scores at the 2 × pairs seeds are exchangeable. Were a seed
special (the protocol's own seed keeping other tokens, a seed's parity changing the draws), its scores
would sit apart on every problem. The test pools every seed of every cell: the statistic of a cell is
the variance, across seeds, of each seed's mean over the problems; under exchangeability shuffling
each problem's scores across the seeds leaves its distribution unchanged, so the p-value is the share
of such shuffles (each problem apart, every cell at once) whose statistic is at least the observed
one. Cells are pooled by the sum of their statistics, each over its own mean under shuffling, so that no
cell's scale dominates; cells whose problems score the same at every seed carry no information and are
left out. A Monte Carlo p-value, (1 + #{at least as large})/(1 + draws), holds its level at any number
of draws.

**The equivalence test's level.** Two seeds of the null differ by nothing but chance, so A/A runs say
nothing about the margin. A shift is injected instead: one arm of each A/A pair is moved by the margin
(alternately up and down), which puts the true mean difference exactly on the margin, where *equivalent*
must come out at most α of the time. A continuous score is shifted by the margin itself; a pass/fail
score (0 or 1, the exact test) by turning each of its failures into a pass (or each pass into a failure)
with the probability that moves its mean by the margin in expectation. Only comparisons that can declare
equivalence (enough problems: kvbench.results.stats.equivalence_floor) are counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvbench.results.stats import compare_arms, equivalence_floor, verdicts

DRAWS = 10_000
SEED = 0
_CHUNK = 1000
"""Shuffles drawn at once (memory: chunk × problems × seeds floats per cell)."""


@dataclass(frozen=True)
class Exchangeability:
    """The pooled test that the null's seeds are exchangeable, and each cell's own."""

    p_value: float
    """Pooled over every cell (NaN: no cell varies across seeds)."""
    cells: dict[str, float]
    """Cell -> its own p-value (cells without variation left out)."""
    seeds: int
    """Seeds per cell, the most among the cells."""
    draws: int


def _spread(scores: np.ndarray) -> np.ndarray:
    """[..., problems, seeds] -> the variance across seeds of each seed's mean over problems."""
    return scores.mean(axis=-2).var(axis=-1)


def seed_exchangeability(
    cells: Mapping[str, Sequence[Mapping[Any, float]]], *, draws: int = DRAWS, seed: int = SEED
) -> Exchangeability:
    """``cells``: cell -> its per-problem scores at each seed (problems every seed has are compared)."""
    rng = np.random.default_rng(seed)
    observed: dict[str, float] = {}
    shuffled: dict[str, np.ndarray] = {}
    most = 0
    for name, runs in cells.items():
        shared = sorted(set.intersection(*(set(r) for r in runs)), key=str) if len(runs) > 1 else []
        if not shared:
            continue
        matrix = np.array([[r[p] for r in runs] for p in shared], dtype=float)  # [problems, seeds]
        most = max(most, matrix.shape[1])
        stats = np.concatenate(
            [
                _spread(rng.permuted(np.broadcast_to(matrix, (k, *matrix.shape)), axis=-1))
                for k in (min(_CHUNK, draws - start) for start in range(0, draws, _CHUNK))
            ]
        )
        if stats.mean() > 0:  # some problem scores differ between seeds
            observed[name], shuffled[name] = float(_spread(matrix)), stats
    if not observed:
        return Exchangeability(math.nan, {}, most, draws)
    pooled = sum(observed[c] / shuffled[c].mean() for c in observed)
    pooled_shuffled = sum(shuffled[c] / shuffled[c].mean() for c in observed)
    return Exchangeability(
        _share_at_least(pooled_shuffled, pooled),
        {c: _share_at_least(shuffled[c], observed[c]) for c in observed},
        most,
        draws,
    )


def _share_at_least(shuffled: np.ndarray, observed: float) -> float:
    """(1 + #{shuffled ≥ observed})/(1 + draws), ties within rounding counted as at least."""
    at_least = int((shuffled >= observed - 1e-12 * max(1.0, abs(observed))).sum())
    return (1 + at_least) / (1 + shuffled.size)


@dataclass(frozen=True)
class ShiftCalibration:
    """How often *equivalent* (or *practically equivalent*) came out with the true difference on the
    margin: at most α where the equivalence test holds its level."""

    comparisons: int
    """A/A pairs with a margin and enough problems to declare equivalence: the rate's denominator."""
    equivalent: int
    rate: float
    low: float
    high: float
    """Clopper-Pearson 95% interval of the rate (its Monte Carlo error)."""
    left_out: int
    """Pairs that could not be counted: no margin, too few problems, or no score to move."""


EQUIVALENT = ("equivalent to null", "practically equivalent")


def injected_shift(
    pairs: Sequence[tuple[Mapping[Any, float], Mapping[Any, float], float]], *, seed: int = SEED
) -> ShiftCalibration:
    """``pairs``: (scores at one seed, scores at the other, margin) per A/A comparison; the second arm
    is moved by the margin, up for even pairs and down for odd ones, and each pair judged on its own."""
    from scipy.stats import binomtest

    rng = np.random.default_rng(seed)
    counted = equivalent = 0
    for index, (first, second, margin) in enumerate(pairs):
        shared = sorted(set(first) & set(second), key=str)
        values = np.array([second[p] for p in shared], dtype=float)
        binary = bool(np.isin(values, (0.0, 1.0)).all()) and all(first[p] in (0.0, 1.0) for p in shared)
        floor = equivalence_floor(margin, exact=binary) if margin > 0 else math.inf
        if not len(shared) >= floor:
            continue
        moved = _moved(values, margin, 1 if index % 2 == 0 else -1, binary, rng)
        if moved is None:
            continue
        arm, baseline = {p: first[p] for p in shared}, dict(zip(shared, moved, strict=True))
        (judged,) = verdicts([compare_arms(arm, baseline, margin)])
        counted += 1
        equivalent += judged.verdict in EQUIVALENT
    interval = binomtest(equivalent, counted).proportion_ci(method="exact") if counted else None
    return ShiftCalibration(
        counted,
        equivalent,
        equivalent / counted if counted else math.nan,
        interval.low if interval else math.nan,
        interval.high if interval else math.nan,
        len(pairs) - counted,
    )


def _moved(
    values: np.ndarray, margin: float, direction: int, binary: bool, rng: np.random.Generator
) -> np.ndarray | None:
    """``values`` moved by ``direction`` × margin: exactly for a continuous score, in expectation for a
    pass/fail one (None where too few scores can move: all passes, say, for an upward shift)."""
    if not binary:
        return values + direction * margin
    movable = values == (0.0 if direction > 0 else 1.0)
    chance = margin * values.size / movable.sum() if movable.any() else math.inf
    if chance > 1:
        return None
    flip = movable & (rng.random(values.size) < chance)
    return np.where(flip, 1.0 - values, values)

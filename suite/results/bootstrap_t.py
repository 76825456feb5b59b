"""The studentized (bootstrap-t) interval and tests for the mean of per-problem differences.

A percentile bootstrap over few problems is too narrow (it covered a normal mean 88% of the time at
8 problems), and Student's t assumes a symmetric spread that skewed differences and rare large failures
do not have. The bootstrap-t resamples the problems, studentizes each resample's mean,
t* = (mean* − mean)/se*, and reads the interval and every test from that distribution (Efron and
Tibshirani 1993, ch. 12): the skew of the differences shapes the interval. A resample without spread
has se* = 0 and t* = ±∞ in the direction its mean moved (0 where it did not): a lone large failure that
most resamples leave out makes the interval reach the metric's bound rather than look precise.

Differences that do not vary at all (every problem differs by the same c, or none differs) give the
bootstrap nothing to resample. Then, for a metric bounded to [0, 1] (differences in [−1, 1]), the exact
bound for that event is used: n problems all equal to c have probability at most ((μ − lo)/(c − lo))ⁿ
when the mean is μ < c and every value is at least lo = −1 (the rest of the mass at lo), and likewise
above; for an unbounded metric nothing is known and the interval is (−∞, ∞).

Every function takes many rows at once (replicates in the simulation test, one row in a table): the
resamples are one matrix of counts, shared by the rows, so each resampled mean is a matrix product.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

BOUNDED = (-1.0, 1.0)
"""The range of a difference between two scores in [0, 1]."""
UNBOUNDED = (-math.inf, math.inf)


@dataclass(frozen=True)
class Studentized:
    """Rows of per-problem differences, studentized over shared resamples of their problems."""

    mean: np.ndarray
    """[rows] the mean difference."""
    se: np.ndarray
    """[rows] its standard error, s/√n (0: the differences do not vary)."""
    t: np.ndarray
    """[rows, draws] t* of each resample, sorted."""
    constant: np.ndarray
    """[rows] whether every difference is the same: no spread to studentize by."""
    problems: int
    bounds: tuple[float, float]


def studentize(rows: np.ndarray, counts: np.ndarray, bounds: tuple[float, float] = BOUNDED) -> Studentized:
    """``rows`` [R, n] of differences; ``counts`` [draws, n] how often each problem appears in each
    resample (kvbench.results.stats shares them between calls)."""
    rows = np.atleast_2d(np.asarray(rows, dtype=float))
    n = rows.shape[1]
    mean = rows.mean(axis=1)
    centred = rows - mean[:, None]  # centred first: the resampled variances lose no precision
    scale = np.maximum(np.abs(centred).max(axis=1), 1e-300)
    constant = np.abs(centred).max(axis=1) <= 1e-12 * np.maximum(1.0, np.abs(mean))
    squares = centred**2
    if n < 2:
        t = np.zeros((rows.shape[0], counts.shape[0]))
        return Studentized(mean, np.zeros_like(mean), t, np.ones_like(constant), n, bounds)
    shift = centred @ counts.T / n  # mean* − mean
    variance = (squares @ counts.T - n * shift**2) / (n - 1)
    se_star = np.sqrt(np.maximum(variance, 0.0) / n)
    flat = se_star <= 1e-12 * scale[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        studentized = np.where(
            flat,
            np.where(np.abs(shift) <= 1e-12 * scale[:, None], 0.0, np.sign(shift) * np.inf),
            shift / se_star,
        )
    se = np.sqrt(squares.sum(axis=1) / (n - 1) / n)
    return Studentized(mean, np.where(constant, 0.0, se), np.sort(studentized, axis=1), constant, n, bounds)


def _tail_share(s: Studentized, value: np.ndarray, above: bool) -> np.ndarray:
    """(1 + #{t* ≥ value})/(1 + draws) per row (``above``; else #{t* ≤ value}): a Monte Carlo p-value
    that never falls below its level."""
    draws = s.t.shape[1]
    side: Literal["left", "right"] = "left" if above else "right"
    found = np.array([np.searchsorted(t, v, side=side) for t, v in zip(s.t, value, strict=True)])
    return (1 + (draws - found if above else found)) / (1 + draws)


def _constant_p(s: Studentized, null: float, above: bool) -> np.ndarray:
    """For rows without spread: the largest chance that n problems all differ by their mean c when the
    true mean is ``null`` (H0: μ ≤ null if ``above``, else μ ≥ null) and differences stay in bounds."""
    lo, hi = s.bounds
    c = s.mean
    with np.errstate(divide="ignore", invalid="ignore"):
        if above:  # c above null: mass at c is at most (null − lo)/(c − lo)
            share = np.where(c > null, (null - lo) / (c - lo), 1.0)
        else:
            share = np.where(c < null, (hi - null) / (hi - c), 1.0)
    share = np.where(np.isfinite(share), np.clip(share, 0.0, 1.0), 1.0)
    return share**s.problems


def one_sided_p(s: Studentized, null: float, above: bool) -> np.ndarray:
    """p-value of H0: μ ≤ null against μ > null (``above``), else of H0: μ ≥ null against μ < null."""
    with np.errstate(divide="ignore", invalid="ignore"):
        observed = (s.mean - null) / np.where(s.se > 0, s.se, 1.0)
    p = _tail_share(s, np.where(s.se > 0, observed, 0.0), above)
    return np.where(s.constant, _constant_p(s, null, above), p)


def two_sided_p(s: Studentized, null: float = 0.0) -> np.ndarray:
    smaller = np.minimum(one_sided_p(s, null, above=True), one_sided_p(s, null, above=False))
    return np.minimum(1.0, 2 * smaller)


def equivalence_p(s: Studentized, margin: float) -> np.ndarray:
    """TOST: the larger of the p-values of H0: μ ≤ −margin and H0: μ ≥ +margin."""
    return np.maximum(one_sided_p(s, -margin, above=True), one_sided_p(s, margin, above=False))


def interval(s: Studentized, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """[mean − t*₍₁₋ₐ₎·se, mean − t*₍ₐ₎·se], a = (1 − level)/2, clipped to the bounds; rows without
    spread get the exact bound for n equal differences."""
    lo, hi = s.bounds
    tail = (1 - level) / 2
    draws = s.t.shape[1]
    # the quantiles as order statistics of the (draws + 1) convention the p-values use
    upper_rank = min(draws - 1, max(0, math.ceil((1 - tail) * (draws + 1)) - 1))
    lower_rank = min(draws - 1, max(0, math.floor(tail * (draws + 1)) - 1))
    with np.errstate(invalid="ignore"):
        low = s.mean - s.t[:, upper_rank] * s.se
        high = s.mean - s.t[:, lower_rank] * s.se
    low, high = np.nan_to_num(low, nan=lo), np.nan_to_num(high, nan=hi)
    root = tail ** (1 / max(s.problems, 1))
    with np.errstate(invalid="ignore"):
        flat_low = np.where(np.isfinite(lo), lo + (s.mean - lo) * root, -np.inf)
        flat_high = np.where(np.isfinite(hi), hi - (hi - s.mean) * root, np.inf)
    low = np.where(s.constant, flat_low, np.clip(low, lo, hi))
    high = np.where(s.constant, flat_high, np.clip(high, lo, hi))
    return low, high

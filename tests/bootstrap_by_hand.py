"""The studentized bootstrap (bootstrap-t) of a mean of paired differences, written out in numpy apart
from kvbench.results.bootstrap_t, for the tests to compare with: 10,000 resamples of the problems drawn
as kvbench draws them (numpy's default_rng(0), picks of shape [draws, n])."""

from __future__ import annotations

import math

import numpy as np

DRAWS = 10_000


def studentized(values: list[float] | np.ndarray) -> tuple[float, float, np.ndarray]:
    """(mean, se, sorted t*): t* = (mean* − mean)/se* of each resample, ±inf for a resample without
    spread whose mean moved, 0 for one that did not."""
    data = np.asarray(values, dtype=float)
    n = len(data)
    mean = data.mean()
    picks = np.random.default_rng(0).integers(0, n, size=(DRAWS, n))
    resampled = data[picks]
    shift = resampled.mean(axis=1) - mean
    spread = resampled.std(axis=1, ddof=1) / np.sqrt(n)
    flat = spread < 1e-12
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(flat, np.where(np.abs(shift) < 1e-12, 0.0, np.sign(shift) * np.inf), shift / spread)
    return float(mean), float(data.std(ddof=1) / np.sqrt(n)), np.sort(t)


def bootstrap_interval(values: list[float]) -> tuple[float, float]:
    """The interval [mean − t*₍₉₇.₅₎·se, mean − t*₍₂.₅₎·se] at the order statistics of the (draws + 1)
    convention, clipped to [−1, 1]; for differences that do not vary, the exact bound for n equal
    differences in [−1, 1]."""
    data = np.asarray(values, dtype=float)
    n, mean = len(data), data.mean()
    if np.ptp(data) == 0:
        root = 0.025 ** (1 / n)
        return -1 + (mean + 1) * root, 1 - (1 - mean) * root
    mean, se, t = studentized(data)
    upper, lower = t[math.ceil(0.975 * (DRAWS + 1)) - 1], t[math.floor(0.025 * (DRAWS + 1)) - 1]
    return float(np.clip(mean - upper * se, -1, 1)), float(np.clip(mean - lower * se, -1, 1))


def bootstrap_p(values: list[float], null: float = 0.0) -> float:
    """The two-sided test of mean = ``null`` on differences that vary: twice the smaller of the shares
    (1 + #{t* ≥ t})/(1 + draws) and (1 + #{t* ≤ t})/(1 + draws), t = (mean − null)/se."""
    mean, se, t = studentized(values)
    observed = (mean - null) / se
    above = (1 + np.sum(t >= observed)) / (DRAWS + 1)
    below = (1 + np.sum(t <= observed)) / (DRAWS + 1)
    return float(min(1.0, 2 * min(above, below)))


def bootstrap_tost(values: list[float], margin: float) -> float:
    """The bootstrap-t TOST on differences that vary: the larger of (1 + #{t* ≥ (mean + margin)/se})/(1 +
    draws), against mean ≤ −margin, and (1 + #{t* ≤ (mean − margin)/se})/(1 + draws), against mean ≥
    +margin."""
    mean, se, t = studentized(values)
    above = (1 + np.sum(t >= (mean + margin) / se)) / (DRAWS + 1)
    below = (1 + np.sum(t <= (mean - margin) / se)) / (DRAWS + 1)
    return float(max(above, below))

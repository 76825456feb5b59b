"""Statistics over problems: cell scores with a problem-clustered bootstrap, paired differences.

The unit of resampling is the problem (its samples stay together), because samples of one problem are
not independent. Differences between two arms are paired on the problems both arms share.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np

DRAWS = 10_000
SEED = 0


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float
    problems: int


CACHED_RESAMPLES = 2**23
"""Resample matrices up to this many entries (64 MiB) are kept, six at most; larger ones are redrawn."""


@lru_cache(maxsize=6)
def _cached_counts(n: int, draws: int, seed: int) -> np.ndarray:
    return _resample_counts(n, draws, seed)


def _resample_counts(n: int, draws: int, seed: int) -> np.ndarray:
    """[draws, n]: how often each of n problems appears in each bootstrap resample.

    The resamples depend only on (n, draws, seed), so a table's many intervals over the same problems
    share them; a mean is then one matrix product instead of a gather of draws × n values.
    """
    picks = np.random.default_rng(seed).integers(0, n, size=(draws, n))
    rows = np.arange(draws)[:, None] * n
    counts = np.bincount((picks + rows).ravel(), minlength=draws * n).reshape(draws, n).astype(float)
    counts.flags.writeable = False  # shared between calls through the cache
    return counts


def bootstrap_mean(
    values: Sequence[float] | np.ndarray, *, draws: int = DRAWS, seed: int = SEED, level: float = 0.95
) -> Estimate:
    """Mean of per-problem values with a percentile bootstrap CI over problems."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    n = values.size
    resample = _cached_counts if n * draws <= CACHED_RESAMPLES else _resample_counts
    counts = resample(n, draws, seed)
    means = counts @ values / n
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Estimate(float(values.mean()), float(low), float(high), int(values.size))


def paired_difference(arm: Mapping[Any, float], other: Mapping[Any, float], **kwargs: Any) -> Estimate:
    """Mean over shared problems of arm − other, with a bootstrap CI over those problems."""
    shared = sorted(set(arm) & set(other))
    return bootstrap_mean(np.array([arm[p] - other[p] for p in shared]), **kwargs)


def pool(tasks: Mapping[str, Mapping[str, float]]) -> dict[tuple[str, str], float]:
    """Tasks pooled into one declared group (AIME 2025 + 2026 + HMMT): the clusters are (task, problem).

    Problem ids are only unique within a task, so the task is part of the key; the bootstrap and the
    paired tests then resample and match (task, problem) clusters.
    """
    return {(task, problem): value for task, scores in tasks.items() for problem, value in scores.items()}


Verdict = Literal["beats null", "ties null", "loses to null"]


@dataclass(frozen=True)
class PairedComparison:
    """A policy against a baseline on the problems both arms share, matched by problem id."""

    difference: Estimate
    wins: int
    ties: int
    losses: int
    p_value: float
    """Exact two-sided sign test on the non-tied problems (scipy.stats.binomtest)."""
    excluded: tuple[Hashable, ...]
    """Problems present in only one arm: left out, and reported."""
    p_adjusted: float | None = None
    verdict: Verdict | None = None


def compare_arms(arm: Mapping[Any, float], baseline: Mapping[Any, float], **kwargs: Any) -> PairedComparison:
    """Per-problem scores of two arms (problem id -> mean over samples) compared on shared problems."""
    from scipy.stats import binomtest

    shared = sorted(set(arm) & set(baseline))
    excluded = tuple(sorted(set(arm) ^ set(baseline)))
    deltas = np.array([arm[p] - baseline[p] for p in shared])
    wins, losses = int((deltas > 0).sum()), int((deltas < 0).sum())
    decided = wins + losses
    p_value = float(binomtest(wins, decided, 0.5).pvalue) if decided else 1.0
    return PairedComparison(
        difference=bootstrap_mean(deltas, **kwargs),
        wins=wins,
        ties=len(shared) - decided,
        losses=losses,
        p_value=p_value,
        excluded=excluded,
    )


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment: family-wise error control across the policies in one table."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, (len(p_values) - rank) * p_values[index])
        adjusted[index] = min(1.0, running)
    return adjusted


def verdicts(comparisons: list[PairedComparison], alpha: float = 0.05) -> list[PairedComparison]:
    """Holm-corrected verdicts: a policy beats (or loses to) the null only when the corrected test says so."""
    from dataclasses import replace

    adjusted = holm([c.p_value for c in comparisons])
    out = []
    for comparison, p in zip(comparisons, adjusted, strict=True):
        verdict: Verdict = "ties null"
        if p < alpha:
            verdict = "beats null" if comparison.wins > comparison.losses else "loses to null"
        out.append(replace(comparison, p_adjusted=p, verdict=verdict))
    return out


def resolvable_difference(problems: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest win-rate excess over 1/2 a sign test on ``problems`` untied problems detects at ``power``.

    A power note for the tables: with 30 AIME problems, effects below this are not resolvable.
    """
    from scipy.stats import binom

    if problems == 0:
        return float("nan")
    for excess in np.arange(0.0, 0.5001, 0.005):
        rate = 0.5 + excess
        # the critical count of a two-sided exact test at alpha, on the upper side
        critical = int(binom.isf(alpha / 2, problems, 0.5)) + 1
        if binom.sf(critical - 1, problems, rate) >= power:
            return float(excess)
    return 0.5

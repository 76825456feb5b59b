"""Statistics over problems: cell scores with a problem-clustered bootstrap, paired differences.

The unit of resampling is the problem (its samples stay together), because samples of one problem are
not independent. Differences between two arms are paired on the problems both arms share.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

DRAWS = 10_000
SEED = 0


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float
    problems: int


def bootstrap_mean(
    values: np.ndarray, *, draws: int = DRAWS, seed: int = SEED, level: float = 0.95
) -> Estimate:
    """Mean of per-problem values with a percentile bootstrap CI over problems."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(draws, values.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Estimate(float(values.mean()), float(low), float(high), int(values.size))


def paired_difference(arm: Mapping[str, float], other: Mapping[str, float], **kwargs) -> Estimate:
    """Mean over shared problems of arm − other, with a bootstrap CI over those problems."""
    shared = sorted(set(arm) & set(other))
    return bootstrap_mean(np.array([arm[p] - other[p] for p in shared]), **kwargs)

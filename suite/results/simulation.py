"""The simulation that checks the verdict's error rates: sizes, power and interval coverage over a grid.

Size is the rate of *equivalent to null* when the true mean difference sits exactly on the margin (the
equivalence test's error); it must stay at α (plus Monte Carlo error) everywhere on the grid. Power is
the rate of *equivalent* when the true difference is 0. Coverage is the share of 95% intervals of the
shown Δ that contain the true mean. The grid, with the margin at 0.02 (scores in [0, 1]):

- ``normal sd=…``: normal differences of standard deviation 0.01, 0.02 and 0.05;
- ``skewed``: 0.03·(Exp(1) − 1) around the mean (skewed right; both margins are tried, so the left skew
  is covered by symmetry);
- ``rare failures``: the arm equals the null on 90% of problems and is 0.2 worse on 10% (the usual
  value set so that the mean is the one tried: 0 on the lower margin);
- ``rare failures, noisy``: the same with N(0, 0.002) noise on every problem;
- ``0/1 d=…``: one pass/fail sample per problem, the arms differing on a share d of 0.02, 0.05, 0.1 or
  0.3 of problems (the exact test; d = 0.02 puts every differing problem on one side at the margin).

Each is run at n = 4, 8, 15, 30, 60, 150 and 400 problems. Everything is vectorised: the replicates of a
cell are the rows of one matrix, studentized over one shared set of resamples.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvbench.results import bootstrap_t, exact_pairs
from kvbench.results.stats import ALPHA, continuous_equivalence_p, resample_counts

MARGIN = 0.02
PROBLEMS = (4, 8, 15, 30, 60, 150, 400)
SEED = 20240649
"""The simulation's seed: each cell's generator is seeded from it and the cell's name."""

Draw = Callable[[np.random.Generator, float, tuple[int, int]], np.ndarray]
"""(generator, true mean, (replicates, problems)) -> differences."""


def _normal(sd: float) -> Draw:
    return lambda rng, mean, shape: mean + sd * rng.standard_normal(shape)


def _skewed(rng: np.random.Generator, mean: float, shape: tuple[int, int]) -> np.ndarray:
    return mean + 0.03 * (rng.exponential(1.0, shape) - 1.0)


def _rare(noise: float) -> Draw:
    def draw(rng: np.random.Generator, mean: float, shape: tuple[int, int]) -> np.ndarray:
        usual = mean + 0.1 * 0.2  # 90% at usual, 10% at usual − 0.2: the mean is ``mean``
        values = np.where(rng.random(shape) < 0.1, usual - 0.2, usual)
        return values + noise * rng.standard_normal(shape) if noise else values

    return draw


CONTINUOUS: dict[str, Draw] = {
    "normal sd=0.01": _normal(0.01),
    "normal sd=0.02": _normal(0.02),
    "normal sd=0.05": _normal(0.05),
    "skewed": _skewed,
    "rare failures": _rare(0.0),
    "rare failures, noisy": _rare(0.002),
}
DISCORDANCE = (0.02, 0.05, 0.1, 0.3)


@dataclass(frozen=True)
class Cell:
    shape: str
    problems: int
    size: float
    """The largest rate of *equivalent* over the two margins."""
    power: float
    """The rate of *equivalent* at a true difference of 0."""
    coverage: float
    """The share of 95% intervals containing the true mean, at the lower margin and at 0 together."""


def _rng(name: str, problems: int, what: str) -> np.random.Generator:
    return np.random.default_rng([SEED, problems, *map(ord, f"{name}/{what}")])


def continuous_cell(name: str, problems: int, replicates: int, draws: int) -> Cell:
    """The bootstrap-t's rates on one continuous shape at ``problems`` problems."""
    draw = CONTINUOUS[name]
    counts = resample_counts(problems, draws, SEED)
    equivalent, covered = [], []
    for what, mean in (("lower", -MARGIN), ("upper", MARGIN), ("zero", 0.0)):
        rows = draw(_rng(name, problems, what), mean, (replicates, problems))
        s = bootstrap_t.studentize(rows, counts)
        equivalent.append(float(np.mean(continuous_equivalence_p(s, MARGIN) <= ALPHA)))
        if what != "upper":
            low, high = bootstrap_t.interval(s)
            covered.append(float(np.mean((low <= mean) & (mean <= high))))
    return Cell(name, problems, max(equivalent[:2]), equivalent[2], float(np.mean(covered)))


def _trinomial(rng: np.random.Generator, problems: int, replicates: int, d: float, delta: float):
    win, loss = (d + delta) / 2, (d - delta) / 2
    counts = rng.multinomial(problems, [win, loss, 1 - d], size=replicates)
    return counts[:, 0], counts[:, 1]


def binary_cell(d: float, problems: int, replicates: int, coverage_replicates: int = 0) -> Cell:
    """The exact test's rates at discordance d: size by its critical values over many replicates, the
    exact interval's coverage over the distinct (wins, losses) of fewer (NaN: not measured)."""
    name = f"0/1 d={d:g}"
    rates = []
    for what, delta in (("lower", -MARGIN), ("upper", MARGIN), ("zero", 0.0)):
        wins, losses = _trinomial(_rng(name, problems, what), problems, replicates, d, delta)
        rates.append(float(np.mean(exact_pairs.equivalent(wins, losses, problems, MARGIN, ALPHA))))
    covered: list[float] = []
    for what, delta in () if not coverage_replicates else (("lower-cover", -MARGIN), ("zero-cover", 0.0)):
        wins, losses = _trinomial(_rng(name, problems, what), problems, coverage_replicates, d, delta)
        seen = {}
        for pair in set(zip(wins.tolist(), losses.tolist(), strict=True)):
            low, high = exact_pairs.interval(*pair, problems)
            seen[pair] = low <= delta <= high
        covered.append(float(np.mean([seen[p] for p in zip(wins.tolist(), losses.tolist(), strict=True)])))
    coverage = float(np.mean(covered)) if covered else math.nan
    return Cell(name, problems, max(rates[:2]), rates[2], coverage)


def monte_carlo_bound(replicates: int, alpha: float = ALPHA, z: float = 3.0) -> float:
    """α plus z standard errors of a rate measured over ``replicates`` at α."""
    return alpha + z * math.sqrt(alpha * (1 - alpha) / replicates)

"""Statistics over problems: cell scores with a problem-clustered bootstrap, paired differences.

The unit of resampling is the problem (its samples stay together), because samples of one problem are
not independent. Differences between two arms are paired on the problems both arms share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
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


def resample_counts(n: int, draws: int, seed: int) -> np.ndarray:
    """[draws, n]: how often each of n problems appears in each bootstrap resample.

    The resamples depend only on (n, draws, seed), so a table's many intervals over the same problems
    share them; a mean is then one matrix product instead of a gather of draws × n values.
    """
    picks = np.random.default_rng(seed).integers(0, n, size=(draws, n))
    rows = np.arange(draws)[:, None] * n
    counts = np.bincount((picks + rows).ravel(), minlength=draws * n).reshape(draws, n).astype(float)
    counts.flags.writeable = False  # shared between calls through the cache
    return counts


_cached_counts = lru_cache(maxsize=6)(resample_counts)


def bootstrap_mean(
    values: Sequence[float] | np.ndarray, *, draws: int = DRAWS, seed: int = SEED, level: float = 0.95
) -> Estimate:
    """Mean of per-problem values with a percentile bootstrap CI over problems."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    means = _counts(values.size, draws, seed) @ values / values.size
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Estimate(float(values.mean()), float(low), float(high), int(values.size))


def _counts(n: int, draws: int, seed: int) -> np.ndarray:
    return (_cached_counts if n * draws <= CACHED_RESAMPLES else resample_counts)(n, draws, seed)


TIE_TOLERANCE = 1e-9
"""Two scores closer than this (relative to the larger of 1 and their size) are a tie: 0.1 + 0.2 and
0.3 differ by 5.6e-17, a rounding error of the sums that make a mean, never a win."""


def paired_deltas(arm: Mapping[Any, float], other: Mapping[Any, float]) -> np.ndarray:
    """arm − other on the problems both have (sorted by problem), ties within TIE_TOLERANCE set to 0."""
    shared = sorted(set(arm) & set(other))
    a = np.array([arm[p] for p in shared], dtype=float)
    b = np.array([other[p] for p in shared], dtype=float)
    deltas = a - b
    tied = np.abs(deltas) <= TIE_TOLERANCE * np.maximum(1.0, np.maximum(np.abs(a), np.abs(b)))
    return np.where(tied, 0.0, deltas)


def _studentized(deltas: np.ndarray, bounded: bool, draws: int, seed: int) -> tuple[Any, Estimate]:
    """Paired per-problem differences (at least one) studentized over the shared resamples
    (kvbench.results.bootstrap_t), and their mean with its 95% interval; ``bounded``: scores in [0, 1],
    so differences in [−1, 1]."""
    from kvbench.results import bootstrap_t

    bounds = bootstrap_t.BOUNDED if bounded else bootstrap_t.UNBOUNDED
    s = bootstrap_t.studentize(deltas, _counts(deltas.size, draws, seed), bounds)
    low, high = bootstrap_t.interval(s)
    return s, Estimate(float(deltas.mean()), float(low[0]), float(high[0]), int(deltas.size))


def paired_difference(
    arm: Mapping[Any, float],
    other: Mapping[Any, float],
    *,
    bounded: bool | None = False,
    draws: int = DRAWS,
    seed: int = SEED,
) -> Estimate:
    """Mean over shared problems of arm − other, with the studentized bootstrap's interval over them.
    ``bounded`` None: whether every score of either lies in [0, 1] (the bound then limits what an unseen
    problem can change; compare_arms infers it the same way)."""
    if bounded is None:
        bounded = all(0.0 <= v <= 1.0 for scores in (arm, other) for v in scores.values())
    deltas = paired_deltas(arm, other)
    if deltas.size == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    return _studentized(deltas, bounded, draws, seed)[1]


def pool(tasks: Mapping[str, Mapping[str, float]]) -> dict[tuple[str, str], float]:
    """Tasks pooled into one declared group (AIME 2025 + 2026 + HMMT): the clusters are (task, problem).

    Problem ids are only unique within a task, so the task is part of the key; the bootstrap and the
    paired tests then resample and match (task, problem) clusters.
    """
    return {(task, problem): value for task, scores in tasks.items() for problem, value in scores.items()}


Verdict = Literal[
    "beats null", "practically equivalent", "equivalent to null", "inconclusive", "loses to null"
]
Decision = Literal["beats null", "equivalent to null", "loses to null"]
"""A decided verdict: what a count of problems needed is for."""

ALPHA = 0.05
MIN_EQUIVALENCE_PROBLEMS = 30
"""Below this many problems a continuous metric is never declared equivalent: a failure on 10% of
problems goes unseen in 30 problems 4.2% of the time (0.9³⁰), under α, and in 10 problems 35% of the
time; no test of the differences it has seen can account for a failure it has not. The exact test of a
pass/fail metric needs no such floor: its own minimum follows from the margin (all n problems tied has
probability up to (1 − margin)ⁿ, so 149 problems at a margin of 0.02)."""
POWER = 0.8
"""The power the minimum detectable effect and the problems needed are quoted at."""


@dataclass(frozen=True)
class PowerPlan:
    """How many problems would decide, planned from the observed paired differences taken as the truth.

    ``decision`` is None where no number of problems decides at these differences: no problem differs
    (more problems of the same probe stay tied, and a row of zeros says nothing about the spread an
    equivalence test needs), or the arm wins as often as it loses while its mean difference lies outside
    the margin (neither test can decide). ``problems`` is None there, and where the decision would need
    more than MAX_PROBLEMS.
    """

    decision: Decision | None
    problems: int | None


Method = Literal["exact", "bootstrap-t"]
"""How the mean difference was tested: ``exact`` for one pass/fail sample per problem (differences −1,
0, +1: kvbench.results.exact_pairs), ``bootstrap-t`` otherwise (kvbench.results.bootstrap_t)."""


@dataclass(frozen=True)
class PairedComparison:
    """A policy against a baseline on the problems both arms share, matched by problem id."""

    difference: Estimate
    """The mean difference and its 95% interval: the exact one for a pass/fail metric with one sample per
    problem, the studentized bootstrap's otherwise."""
    wins: int
    ties: int
    """Problems whose scores differ by no more than TIE_TOLERANCE."""
    losses: int
    p_value: float
    """Exact two-sided sign test on the non-tied problems (scipy.stats.binomtest)."""
    excluded: tuple[Hashable, ...]
    """Problems present in only one arm: left out, and reported."""
    p_adjusted: float | None = None
    """p_difference, Holm-corrected across the family."""
    verdict: Verdict | None = None
    margin: float = math.nan
    """The equivalence margin, in the metric's units (NaN: none, no equivalence test)."""
    p_equivalence: float = 1.0
    """Two one-sided tests (TOST) of the mean difference against ±margin, the larger p: exact for a
    pass/fail metric, bootstrap-t otherwise (1 below MIN_EQUIVALENCE_PROBLEMS: not tested)."""
    p_equivalence_adjusted: float | None = None
    spread: float = math.nan
    """The standard deviation of the per-problem differences (n − 1 in the denominator)."""
    p_mean: float = 1.0
    """Two-sided test that the mean difference is 0, the test the shown interval inverts: 0 lies outside
    the 95% interval exactly when p_mean < 0.05."""
    method: Method = "bootstrap-t"
    family: str = "table"
    """What the Holm correction ran over, in words (kvbench.results.comparison.table_family)."""
    family_size: int = 1
    margin_from: str = ""
    """Which spec and field declared ``margin`` (kvbench.specs.metric_kind.equivalence_margin)."""

    @property
    def p_difference(self) -> float:
        """The test behind *beats* and *loses*: both the sign test (more problems won than lost) and the
        mean test (the mean difference, the Δ shown) must reject, in the same direction; its p is the
        larger of the two (an intersection-union test, at level α without correction). Where the two
        point different ways it is 1."""
        agree = (self.wins > self.losses and self.difference.value > 0) or (
            self.wins < self.losses and self.difference.value < 0
        )
        return max(self.p_value, self.p_mean) if agree else 1.0

    @property
    def differing(self) -> int:
        """Problems on which the two arms differ (beyond TIE_TOLERANCE)."""
        return self.wins + self.losses

    @property
    def discordance(self) -> float:
        """The share of shared problems on which the two arms differ."""
        shared = self.wins + self.ties + self.losses
        return (self.wins + self.losses) / shared if shared else math.nan

    # the power figures are searched for (tens of ms) and read only where shown: computed when first read
    @cached_property
    def minimum_detectable(self) -> float:
        """The smallest effect the sign test detects at 80% power with these problems at the observed
        discordance (inf: none can be)."""
        return minimum_detectable_effect(self.wins + self.ties + self.losses, self.discordance)

    @cached_property
    def plan(self) -> PowerPlan | None:
        """The problems that would give a decided verdict 80% power at the observed differences, and
        which verdict (None without a margin or problems)."""
        shared = self.wins + self.ties + self.losses
        if not shared:
            return None
        return plan_decision(
            self.wins / shared,
            self.losses / shared,
            self.difference.value,
            self.spread,
            self.margin,
            exact=self.method == "exact",
        )

    @property
    def problems_needed(self) -> int | None:
        return self.plan.problems if self.plan else None


def compare_arms(
    arm: Mapping[Any, float],
    baseline: Mapping[Any, float],
    margin: float = math.nan,
    *,
    bounded: bool | None = None,
    binary: bool | None = None,
    draws: int = DRAWS,
    seed: int = SEED,
) -> PairedComparison:
    """Per-problem scores of two arms (problem id -> mean over samples) compared on shared problems.

    ``margin`` is the equivalence margin in the metric's units (NaN: no equivalence test, no problems
    needed). ``bounded``: the metric's scores lie in [0, 1] (None: whether every score here does);
    ``binary``: one pass/fail sample per problem, tested exactly (None: whether every score is 0 or 1).
    """
    from scipy.stats import binomtest

    from kvbench.results import bootstrap_t, exact_pairs

    shared = sorted(set(arm) & set(baseline))
    excluded = tuple(sorted(set(arm) ^ set(baseline)))
    scores = np.array([[arm[p], baseline[p]] for p in shared], dtype=float).reshape(-1, 2)
    if binary is None:
        binary = bool(scores.size) and bool(np.isin(scores, (0.0, 1.0)).all())
    if bounded is None:
        bounded = binary or bool(((scores >= 0) & (scores <= 1)).all())
    deltas = paired_deltas(arm, baseline)
    n = deltas.size
    wins, losses = int((deltas > 0).sum()), int((deltas < 0).sum())
    decided = wins + losses
    p_value = float(binomtest(wins, decided, 0.5).pvalue) if decided else 1.0
    testable = margin > 0 and n > 0
    if binary and n:
        low, high = exact_pairs.interval(wins, losses, n)
        difference = Estimate(float(deltas.mean()), low, high, n)
        upper, lower = exact_pairs.upper_p(wins, losses, n, 0.0), exact_pairs.lower_p(wins, losses, n, 0.0)
        p_mean = min(1.0, 2 * min(upper, lower))
        p_equivalence = exact_pairs.equivalence_p(wins, losses, n, margin) if testable else 1.0
    elif n:
        s, difference = _studentized(deltas, bounded, draws, seed)
        p_mean = float(bootstrap_t.two_sided_p(s)[0])
        p_equivalence = float(continuous_equivalence_p(s, margin)[0]) if testable else 1.0
    else:
        difference, p_mean, p_equivalence = Estimate(math.nan, math.nan, math.nan, 0), 1.0, 1.0
    return PairedComparison(
        difference=difference,
        wins=wins,
        ties=n - decided,
        losses=losses,
        p_value=p_value,
        excluded=excluded,
        margin=margin,
        p_equivalence=p_equivalence,
        spread=float(deltas.std(ddof=1)) if n > 1 else math.nan,
        p_mean=p_mean,
        method="exact" if binary else "bootstrap-t",
    )


def continuous_equivalence_p(s: Any, margin: float) -> np.ndarray:
    """The bootstrap-t TOST p-values of studentized rows (kvbench.results.bootstrap_t.Studentized), 1
    where there are fewer than MIN_EQUIVALENCE_PROBLEMS problems: equivalence is not tested there."""
    from kvbench.results import bootstrap_t

    if s.problems < MIN_EQUIVALENCE_PROBLEMS:
        return np.ones_like(s.mean)
    return bootstrap_t.equivalence_p(s, margin)


_TAIL = 1e-12
"""Binomial tail mass sign_test_power leaves out on each side."""


def sign_test_power(problems: int, discordance: float, effect: float, alpha: float = ALPHA) -> float:
    """Power of the two-sided exact sign test (p < alpha, in the effect's direction) on ``problems``
    problems, each differing between the arms with probability ``discordance``, when the arm under test
    wins a differing problem with probability 1/2 + effect / (2 · discordance): the share of problems
    won minus the share lost is ``effect`` (the mean score difference, for one pass/fail sample per
    problem). Exact up to 2e-12: the number of differing problems is binomial, and for each count the
    rejection region of scipy's binomtest is summed; counts in the binomial's two tails of mass under
    1e-12 each are left out, which keeps the sum to a few thousand terms at a million problems."""
    from scipy.stats import binom

    if problems <= 0 or not 0 < discordance <= 1 or not 0 <= effect <= discordance:
        return 0.0
    fewest, most = binom.ppf([_TAIL, 1 - _TAIL], problems, discordance)
    differing = np.arange(max(0, int(fewest) - 1), min(problems, int(most) + 1) + 1)
    # the fewest wins of k differing problems that the two-sided test at alpha rejects: 2·P(W ≥ c) < alpha
    critical = binom.isf(alpha / 2, differing, 0.5) + 1
    critical = np.where(2 * binom.sf(critical - 1, differing, 0.5) < alpha, critical, critical + 1)
    win = 0.5 + effect / (2 * discordance)
    rejects = binom.sf(critical - 1, differing, win)
    return float(binom.pmf(differing, problems, discordance) @ rejects)


def minimum_detectable_effect(
    problems: int, discordance: float, alpha: float = ALPHA, power: float = POWER
) -> float:
    """The smallest effect (share won minus share lost) the sign test detects with ``power`` on
    ``problems`` problems at ``discordance``; inf when not even an arm winning every differing problem
    would be, NaN without problems."""
    from scipy.optimize import brentq

    if problems <= 0 or not discordance >= 0:
        return math.nan
    if discordance == 0 or sign_test_power(problems, discordance, discordance, alpha) < power:
        return math.inf
    return float(
        brentq(
            lambda e: sign_test_power(problems, discordance, e, alpha) - power, 0.0, discordance, xtol=1e-6
        )
    )


MAX_PROBLEMS = 1_000_000
"""Beyond this many problems the figure is reported as out of reach (None)."""


def plan_decision(
    win_share: float,
    loss_share: float,
    mean: float,
    spread: float,
    margin: float,
    alpha: float = ALPHA,
    power: float = POWER,
    *,
    exact: bool = False,
) -> PowerPlan | None:
    """The fewest problems at which a decided verdict has ``power``, were the observed per-problem
    differences the truth: each problem won with probability ``win_share``, lost with ``loss_share``,
    its difference of mean ``mean`` and standard deviation ``spread``. None without a margin.

    Two tests can decide, and each figure is planned for one of them alone:

    - the difference test (*beats* or *loses*) is planned with the **sign test's** exact power, which
      depends on the share won minus the share lost (the effect) at their sum (the discordance), not on
      the mean difference; the two coincide for one pass/fail sample per problem. The difference test
      also needs the mean test to reject: where that is the weaker of the two, the figure is too low.
    - the equivalence test (*equivalent*, or *practically equivalent* beside a decided difference) is
      planned with the **t-test's** power (equivalence_power, normal differences of the observed mean
      and spread), never below the fewest problems at which it can declare anything (equivalence_floor).
      For a bootstrap-t metric that is the test's large-sample behaviour; for a pass/fail metric (the
      exact test, ``exact``) it is a normal approximation, which the exact test meets a little late
      (docs/limitations.md gives the measured shortfall).

    Where the mean lies outside the margin only the difference test can decide: the figure is the sign
    test's. Inside it, the figure is the equivalence test's, unless the sign test reaches the power with
    fewer problems: a reader with that many problems would then first see a *beats* (or *loses*) inside
    the margin.
    """
    if not margin > 0 or math.isnan(mean):
        return None
    if win_share == loss_share == 0:  # every difference is exactly 0: more problems stay tied
        return PowerPlan(None, None)
    effect = win_share - loss_share
    sign: Decision = "beats null" if effect > 0 else "loses to null"
    equivalent = abs(mean) < margin and spread > 0
    if not equivalent:
        if effect == 0:
            return PowerPlan(None, None)
        return PowerPlan(sign, sign_test_problems(win_share + loss_share, abs(effect), alpha, power))
    needed = equivalence_problems(mean, spread, margin, alpha, power)
    if needed is not None:  # never below the fewest problems at which the test can declare equivalence
        needed = max(needed, equivalence_floor(margin, alpha, exact=exact))
    fewer = needed - 1 if needed is not None else MAX_PROBLEMS
    first = sign_test_problems(win_share + loss_share, abs(effect), alpha, power, fewer) if effect else None
    if first is not None:
        return PowerPlan(sign, first)
    return PowerPlan("equivalent to null", needed)


def equivalence_floor(margin: float, alpha: float = ALPHA, *, exact: bool = False) -> int:
    """The fewest problems at which equivalence can be declared: MIN_EQUIVALENCE_PROBLEMS for the
    bootstrap-t; for the exact test, the n at which every problem tied has probability (1 − margin)ⁿ
    at most α (149 at a margin of 0.02)."""
    if not exact:
        return MIN_EQUIVALENCE_PROBLEMS
    return max(1, math.ceil(math.log(alpha) / math.log1p(-min(margin, 1 - 1e-12))))


def sign_test_problems(
    discordance: float, effect: float, alpha: float = ALPHA, power: float = POWER, most: int = MAX_PROBLEMS
) -> int | None:
    """Problems that give the sign test ``power`` against ``effect`` (share won minus share lost) at
    ``discordance``; None beyond ``most``. The exact power is not quite monotone in n (the test is
    discrete): the figure is where bisection over n finds it crossing."""
    if not 0 < effect <= discordance <= 1:
        return None
    # below 6 problems no two-sided sign test rejects at 5% (5 of 5: p = 0.0625)
    return _fewest_problems(lambda n: sign_test_power(n, discordance, effect, alpha) >= power, 6, most)


def equivalence_power(
    problems: int, mean: float, spread: float, margin: float, alpha: float = ALPHA
) -> float:
    """Power of equivalence_p's test (two one-sided t-tests at ``alpha`` against ±margin) on
    ``problems`` independent normal differences of mean ``mean`` and standard deviation ``spread``.

    The test declares equivalence when the mean d̄ lies inside ±(margin − t·S/√n), t the 1 − α quantile
    of Student's t with n − 1 degrees of freedom and S the sample standard deviation. d̄ ~ N(mean, σ²/n)
    and V = (n − 1)S²/σ² ~ χ²(n − 1) are independent, so, with u = F(V) and h(u) = t·σ·√(V/(n − 1))/√n,

        power = ∫₀^F(v*) [Φ((margin − h − mean)√n/σ) − Φ((h − margin − mean)√n/σ)] du,

    F the χ²(n − 1) distribution function and v* = (n − 1)(margin·√n/(t·σ))² the V at which the interval
    no longer fits inside the margins (the exact power, which Owen's Q function also gives). Integrating
    over u keeps the integrand bounded however narrow χ² is. Differences that are not normal (a 0/1
    metric's −1, 0, +1) make it an approximation. Every figure for the equivalence test comes from
    this function: where equivalence_p changes, this changes with it.
    """
    from scipy import integrate, special

    if problems < 2 or not spread > 0 or not margin > 0:
        return 0.0
    df = problems - 1
    t = special.stdtrit(df, 1 - alpha)
    se = spread / math.sqrt(problems)
    widest = df * (margin / (t * se)) ** 2  # v*
    # over q = 1 − u, the χ² survival, which keeps its precision where u nears 1; the integrand falls
    # to 0 over the last stretch of V below v*, which may hold little mass: quad is shown where it lies
    falls = sorted({float(special.chdtrc(df, widest * c)) for c in (0.5, 0.8, 0.95, 0.99)})

    def inside(q: float) -> float:
        half = t * se * math.sqrt(special.chdtri(df, q) / df)
        return max(0.0, special.ndtr((margin - half - mean) / se) - special.ndtr((half - margin - mean) / se))

    # below q = 1e-12 (χ² far in its upper tail) the integrand, at most 1, falls from its plateau to 0
    # over a stretch too narrow for quad, which warns of bad behaviour there: it adds under 1e-12
    start = max(float(special.chdtrc(df, widest)), 1e-12)
    breaks = [q for q in falls if start < q < 1.0] or None
    return float(integrate.quad(inside, start, 1.0, points=breaks, limit=200, epsabs=1e-10)[0])


def equivalence_problems(
    mean: float, spread: float, margin: float, alpha: float = ALPHA, power: float = POWER
) -> int | None:
    """Problems that give the equivalence test ``power`` at this mean and spread; None where no
    number does (the mean on or outside the margin, no spread) or beyond MAX_PROBLEMS."""
    if not abs(mean) < margin or not spread > 0:
        return None
    return _fewest_problems(
        lambda n: equivalence_power(n, mean, spread, margin, alpha) >= power, 2, MAX_PROBLEMS
    )


def _fewest_problems(enough: Callable[[int], bool], first: int, most: int) -> int | None:
    """The fewest n in [first, most] with enough(n), by doubling then bisection; None if not even
    ``most`` is enough."""
    if first > most:
        return None
    if enough(first):
        return first
    low = first  # never enough
    while True:
        if low >= most:
            return None
        high = min(low * 2, most)
        if enough(high):
            break
        low = high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment: family-wise error control across the policies in one table."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, (len(p_values) - rank) * p_values[index])
        adjusted[index] = min(1.0, running)
    return adjusted


def verdicts(
    comparisons: list[PairedComparison], alpha: float = ALPHA, family: str = "table"
) -> list[PairedComparison]:
    """Holm-corrected verdicts across one family of comparisons (``family`` names it: a table, a
    sweep). Two tests, each Holm-corrected across the family:

    - the difference test (PairedComparison.p_difference: the sign test and the mean test agreeing);
    - the equivalence test (TOST against ±margin).

    The difference decided and equivalence shown too: *practically equivalent* (it differs from the
    null, by less than the margin). The difference decided alone: *beats null* or *loses to null*, by the
    sign of the mean difference. Equivalence alone: *equivalent to null*. Neither: *inconclusive*.
    """
    adjusted = holm([c.p_difference for c in comparisons])
    equivalent = holm([c.p_equivalence for c in comparisons])
    out = []
    for comparison, p, p_equal in zip(comparisons, adjusted, equivalent, strict=True):
        verdict: Verdict = "inconclusive"
        if p < alpha and p_equal < alpha:
            verdict = "practically equivalent"
        elif p < alpha:
            verdict = "beats null" if comparison.difference.value > 0 else "loses to null"
        elif p_equal < alpha:
            verdict = "equivalent to null"
        out.append(
            replace(
                comparison,
                p_adjusted=p,
                p_equivalence_adjusted=p_equal,
                verdict=verdict,
                family=family,
                family_size=len(comparisons),
            )
        )
    return out


def resolvable_difference(problems: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest win-rate excess over 1/2 a sign test on ``problems`` untied problems detects at ``power``.

    A power note for the tables: with 30 AIME problems, effects below this are not resolvable.
    """
    if problems == 0:
        return float("nan")
    for excess in np.arange(0.0, 0.5001, 0.005):
        # every problem differs (discordance 1): winning 1/2 + excess of them is an effect of 2 · excess
        if sign_test_power(problems, 1.0, 2 * excess, alpha) >= power:
            return float(excess)
    return 0.5


@dataclass(frozen=True)
class Calibration:
    """A/A comparisons (the null against itself at other seeds): how often each verdict came out."""

    comparisons: int
    verdicts: dict[str, int]
    false_positive_rate: float
    """The share of comparisons that *can* reject (attainable level above 0) called *beats*, *loses* or
    *practically equivalent*: a decided difference. At most α where the tests hold their level."""
    low: float
    high: float
    """Clopper-Pearson 95% interval of the false-positive rate."""
    covered: float
    """The share of the shown 95% intervals that contain 0 (nominally at least 95%), over comparisons
    where some problem differs (an all-tied pair's interval contains 0 by construction)."""
    levels: tuple[float, ...] = ()
    """Each comparison's exact attainable level: the chance, were the two seeds exchangeable, that the
    sign test at α rejects given its number of differing problems (0 where it cannot reject)."""
    testable: int = 0
    """Comparisons whose attainable level is above 0: the rate's denominator."""
    expected: float = math.nan
    """The false positives expected were the seeds exchangeable: the sum of the attainable levels."""


def attainable_level(differing: int, alpha: float = ALPHA) -> float:
    """P(the two-sided exact sign test rejects at ``alpha``) on ``differing`` problems each won with
    probability 1/2: the test's real level at that count (0 below 6 differing problems)."""
    from scipy.stats import binom, binomtest

    if differing <= 0:
        return 0.0
    rejected = [w for w in range(differing + 1) if binomtest(w, differing, 0.5).pvalue < alpha]
    return float(binom.pmf(rejected, differing, 0.5).sum()) if rejected else 0.0


def calibration(comparisons: Sequence[PairedComparison], level: float = 0.95) -> Calibration:
    """Tally of judged A/A comparisons (each its own family: Holm only lowers the rate). The rate counts
    only comparisons that could reject: with 4 problems none can (the smallest p is 0.125)."""
    from scipy.stats import binomtest

    n = len(comparisons)
    counts = {v: sum(c.verdict == v for c in comparisons) for v in Verdict.__args__}  # type: ignore[attr-defined]
    levels = tuple(attainable_level(c.differing) for c in comparisons)
    able = [c for c, a in zip(comparisons, levels, strict=True) if a > 0]
    decided = ("beats null", "loses to null", "practically equivalent")
    false = sum(c.verdict in decided for c in able)
    interval = binomtest(false, len(able)).proportion_ci(level, method="exact") if able else None
    differing = [c for c in comparisons if c.differing]
    covered = sum(c.difference.low <= 0 <= c.difference.high for c in differing)
    return Calibration(
        comparisons=n,
        verdicts=counts,
        false_positive_rate=false / len(able) if able else math.nan,
        low=interval.low if interval else math.nan,
        high=interval.high if interval else math.nan,
        covered=covered / len(differing) if differing else math.nan,
        levels=levels,
        testable=len(able),
        expected=float(sum(levels)),
    )

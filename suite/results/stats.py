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


_cached_counts = lru_cache(maxsize=6)(_resample_counts)


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


Verdict = Literal["beats null", "equivalent to null", "inconclusive", "loses to null"]
Decision = Literal["beats null", "equivalent to null", "loses to null"]
"""A decided verdict: what a count of problems needed is for."""

ALPHA = 0.05
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
    sign_first: float = 0.0
    """Where the decision is *equivalent* and the arm wins more (or fewer) problems than it loses: the
    sign test's power at ``problems``, which is the share of such runs that end *beats* (or *loses*)
    instead, since the verdict rule asks the sign test first."""


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
    margin: float = math.nan
    """The protocol's equivalence margin, in the task's metric."""
    p_equivalence: float = 1.0
    """Two one-sided t-tests (TOST) of the per-problem differences against ±margin: the larger p."""
    p_equivalence_adjusted: float | None = None
    spread: float = math.nan
    """The standard deviation of the per-problem differences (n − 1 in the denominator)."""

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
            self.wins / shared, self.losses / shared, self.difference.value, self.spread, self.margin
        )

    @property
    def problems_needed(self) -> int | None:
        return self.plan.problems if self.plan else None


def compare_arms(
    arm: Mapping[Any, float], baseline: Mapping[Any, float], margin: float = math.nan, **kwargs: Any
) -> PairedComparison:
    """Per-problem scores of two arms (problem id -> mean over samples) compared on shared problems.

    ``margin`` is the protocol's equivalence margin (NaN: no equivalence test, no problems needed).
    """
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
        margin=margin,
        p_equivalence=equivalence_p(deltas, margin),
        spread=float(deltas.std(ddof=1)) if deltas.size > 1 else math.nan,
    )


def equivalence_p(deltas: Sequence[float] | np.ndarray, margin: float) -> float:
    """TOST p-value that the mean per-problem difference lies inside ±margin.

    Problems are the unit (each problem's samples were averaged first), so samples of one problem are
    never counted as independent. Both one-sided t-tests run at the verdict's level; the larger p
    decides, which is the same as the (1 − 2α) t-interval lying inside ±margin. Differences without
    spread have no t-test: all zero, the exact bound (1 − margin)^n (the chance that no problem differs
    were the arms to differ on a share ``margin`` of problems, scores in [0, 1]); otherwise 1.
    """
    from scipy.stats import ttest_1samp

    deltas = np.asarray(deltas, dtype=float)
    if deltas.size == 0 or not margin > 0:
        return 1.0
    if deltas.size < 2 or np.ptp(deltas) == 0:
        return float((1 - min(margin, 1.0)) ** deltas.size) if not deltas.any() else 1.0
    above = ttest_1samp(deltas, -margin, alternative="greater").pvalue
    below = ttest_1samp(deltas, margin, alternative="less").pvalue
    return float(max(above, below))


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
) -> PowerPlan | None:
    """The fewest problems at which a decided verdict has ``power``, were the observed per-problem
    differences the truth: each problem won with probability ``win_share``, lost with ``loss_share``,
    its difference of mean ``mean`` and standard deviation ``spread``. None without a margin.

    Two tests can decide, and each is planned from what it reads. The sign test sees only signs: its
    power depends on the share won minus the share lost (the effect) at their sum (the discordance),
    not on the mean difference; the two coincide for one pass/fail sample per problem. It can decide
    (*beats* or *loses*, by the sign of the effect) whenever the effect is not 0. The equivalence test
    reads the mean and spread: it can decide only when the mean lies inside ±margin, and has no spread
    to plan with when every difference is the same. Where the mean lies outside the margin the figure
    is the sign test's; inside it, the equivalence test's, unless the sign test would reach the power
    with fewer problems: the verdict rule asks the sign test first, so that is the verdict the reader
    would then see. Each figure is its own test's; where both tests have power, a decided verdict of
    either kind comes with fewer problems than either figure (PowerPlan.sign_first says how often the
    sign test would pre-empt the equivalence the figure is for).
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
    fewer = needed - 1 if needed is not None else MAX_PROBLEMS
    first = sign_test_problems(win_share + loss_share, abs(effect), alpha, power, fewer) if effect else None
    if first is not None:
        return PowerPlan(sign, first)
    rival = sign_test_power(needed, win_share + loss_share, abs(effect), alpha) if effect and needed else 0.0
    return PowerPlan("equivalent to null", needed, rival)


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


def verdicts(comparisons: list[PairedComparison], alpha: float = ALPHA) -> list[PairedComparison]:
    """Holm-corrected verdicts across one table: a policy beats (or loses to) the null only when the
    corrected sign test says so; it is equivalent to the null only when the corrected TOST says its
    difference lies inside ±margin; otherwise inconclusive. The sign tests and the equivalence tests are
    each Holm-corrected across the table's policies."""
    adjusted = holm([c.p_value for c in comparisons])
    equivalent = holm([c.p_equivalence for c in comparisons])
    out = []
    for comparison, p, p_equal in zip(comparisons, adjusted, equivalent, strict=True):
        verdict: Verdict = "inconclusive"
        if p < alpha:
            verdict = "beats null" if comparison.wins > comparison.losses else "loses to null"
        elif p_equal < alpha:
            verdict = "equivalent to null"
        out.append(replace(comparison, p_adjusted=p, p_equivalence_adjusted=p_equal, verdict=verdict))
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
    """The share called *beats* or *loses*: the sign test's real level, at most α if it holds."""
    low: float
    high: float
    """Clopper-Pearson 95% interval of the false-positive rate."""
    covered: float
    """The share of paired 95% bootstrap intervals that contain 0 (nominally 95%)."""


def calibration(comparisons: Sequence[PairedComparison], level: float = 0.95) -> Calibration:
    """Tally of judged A/A comparisons (each its own family: Holm only lowers the rate)."""
    from scipy.stats import binomtest

    n = len(comparisons)
    counts = {v: sum(c.verdict == v for c in comparisons) for v in Verdict.__args__}  # type: ignore[attr-defined]
    false = counts["beats null"] + counts["loses to null"]
    interval = binomtest(false, n).proportion_ci(level, method="exact") if n else None
    covered = sum(c.difference.low <= 0 <= c.difference.high for c in comparisons)
    return Calibration(
        comparisons=n,
        verdicts=counts,
        false_positive_rate=false / n if n else math.nan,
        low=interval.low if interval else math.nan,
        high=interval.high if interval else math.nan,
        covered=covered / n if n else math.nan,
    )

"""Exact tests and intervals for the paired difference of a pass/fail metric with one sample per problem.

Each problem's difference is +1 (the arm right, the baseline wrong: a win), −1 (a loss) or 0 (a tie).
Over n problems the counts (W, L, T) are trinomial with probabilities (p₊, p₋, 1 − d), d = p₊ + p₋ the
discordance, and the mean difference is Δ = p₊ − p₋, estimated by Δ̂ = (W − L)/n. A hypothesis about Δ
leaves d free (a nuisance), so every p-value here is the *supremum over d* of the tail probability, the
exact unconditional test (Barnard's construction, as for paired proportions in Chan et al. 2003): its
rejection rate is at most α at every d, whatever the number of discordant problems.

The statistic is Tango's score statistic (1998), Z = (W − L − nΔ₀)/√(n(2q̃ + Δ₀ − Δ₀²)), q̃ the
loss probability's maximum-likelihood estimate under Δ = Δ₀: unlike Wald's, whose standard error
vanishes when every problem ties (which then counts as infinitely strong evidence for any Δ₀), it keeps
the null's own spread. At a fixed number of discordant problems m = W + L it rises with W (checked over
every m for n up to 400 and Δ₀ across (−1, 1)), so each tail is, for every m, a run of W from one
end: P(Z ≤ z) = Σₘ Binomial(m; n, d) · Binomial cdf(aₘ; m, π), π = p₊/d the chance that a
discordant problem is a win. That sum is evaluated at every d of a grid over [|Δ₀|, 1] and the largest
is refined by a bounded search. Where every problem ties at a margin Δ₀ = ±δ, the p-value is at least
their probability (1 − d)ⁿ at d = δ: (1 − δ)ⁿ, so that equivalence within ±0.02 needs 149 problems
however the arms agree.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

GRID = 256
"""Points of the discordance grid on which each tail's supremum is searched before it is refined."""


def _z(wins: np.ndarray, m: np.ndarray, n: int, null: float) -> np.ndarray:
    """Tango's score statistic at W wins of m discordant problems out of n (arrays of one shape)."""
    wins = np.asarray(wins, dtype=float)
    losses = np.asarray(m, dtype=float) - wins
    # the restricted maximum-likelihood loss probability q under Δ = null (p₊ = q + null), the positive
    # root of 2n·q² + B·q + C = 0, which makes the likelihood's derivative in q vanish
    b = -(wins + losses) + null * (2 * n - wins + losses)
    c = -losses * null * (1 - null)
    q = (-b + np.sqrt(np.maximum(b * b - 8 * n * c, 0.0))) / (4 * n)
    variance = n * (2 * q + null - null * null)
    excess = wins - losses - n * null
    with np.errstate(divide="ignore", invalid="ignore"):
        z = excess / np.sqrt(variance)  # variance 0: ±inf by the sign of the excess, 0 without one
        return np.where(variance > 0, z, np.where(excess == 0, 0.0, np.sign(excess) * np.inf))


def _most_wins_at_or_below(z: float, n: int, null: float) -> np.ndarray:
    """For every m in 0..n: the largest W in [−1, m] with Z(W, m) ≤ z (−1: none), by bisection over W,
    Z being increasing in W at each m."""
    m = np.arange(n + 1)
    low, high = np.full(n + 1, -1), m.copy()  # invariant: Z(low) ≤ z (or low = −1), answer in [low, high]
    fits = _z(high, m, n, null) <= z
    low = np.where(fits, high, low)
    high = np.where(fits, high, high - 1)
    while np.any(high > low):
        middle = (low + high + 1) // 2
        ok = _z(middle, m, n, null) <= z
        low, high = np.where(ok, middle, low), np.where(ok, high, middle - 1)
    return low


def _lower_tail(z: float, n: int, null: float) -> float:
    """sup over the discordance d of P(Z ≤ z) when Δ = ``null`` (|null| < 1)."""
    from scipy.optimize import minimize_scalar
    from scipy.special import bdtr, gammaln, xlog1py, xlogy

    most = _most_wins_at_or_below(z, n, null)
    m = np.arange(n + 1)
    log_choose = gammaln(n + 1) - gammaln(m + 1) - gammaln(n - m + 1)
    # scipy.special's kernels rather than scipy.stats.binom: the same values without the distribution
    # framework's checks, which cost a millisecond a call in the bounded search's many one-point calls
    some = most >= 0

    def tail(d: np.ndarray) -> np.ndarray:
        """The tail at every discordance of ``d`` at once: [len(d)]."""
        d = np.asarray(d, dtype=float)[:, None]
        win = np.clip((d + null) / (2 * d), 0.0, 1.0)
        discordant = np.exp(log_choose + xlogy(m, d) + xlog1py(n - m, -d))  # Binomial(m; n, d)
        wins_cdf = np.where(some, bdtr(np.maximum(most, 0), m, win), 0.0)  # Binomial cdf(most; m, win)
        return (discordant * wins_cdf).sum(axis=1)

    grid = np.linspace(max(abs(null), 1e-12), 1.0, GRID)
    values = tail(grid)
    best = int(np.argmax(values))
    left, right = grid[max(best - 1, 0)], grid[min(best + 1, GRID - 1)]
    found = float(values[best])
    if right > left:
        refined = minimize_scalar(lambda d: -tail(np.array([d]))[0], bounds=(left, right), method="bounded")
        found = max(found, -float(refined.fun))
    return min(1.0, found)


@lru_cache(maxsize=4096)
def lower_p(wins: int, losses: int, n: int, null: float) -> float:
    """p-value of H0: Δ ≥ ``null`` against Δ < null: sup over d of P(Z ≤ Z observed)."""
    if n <= 0:
        return 1.0
    z = float(_z(np.array(wins), np.array(wins + losses), n, null))
    return _lower_tail(z, n, null)


def upper_p(wins: int, losses: int, n: int, null: float) -> float:
    """p-value of H0: Δ ≤ ``null`` against Δ > null (the mirror of lower_p: wins and losses swapped)."""
    return lower_p(losses, wins, n, -null)


def equivalence_p(wins: int, losses: int, n: int, margin: float) -> float:
    """Exact TOST: the larger of the p-values of H0: Δ ≤ −margin and H0: Δ ≥ +margin."""
    if n <= 0 or not 0 < margin < 1:
        return 1.0
    return max(upper_p(wins, losses, n, -margin), lower_p(wins, losses, n, margin))


@lru_cache(maxsize=4096)
def interval(wins: int, losses: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Δ₀ that neither one-sided test at (1 − level)/2 rejects: its ends found by bisection (the exact
    p-value is close to monotone in Δ₀; each end is where bisection finds it cross)."""
    if n <= 0:
        return -1.0, 1.0
    tail = (1 - level) / 2
    estimate = (wins - losses) / n

    def end(rejects, inside: float, outside: float) -> float:
        if not rejects(outside):
            return outside
        for _ in range(22):  # to 1e-6 of Δ
            middle = (inside + outside) / 2
            inside, outside = (inside, middle) if rejects(middle) else (middle, outside)
        return inside

    low = end(lambda d: upper_p(wins, losses, n, d) <= tail, estimate, -1.0 + 1e-12)
    high = end(lambda d: lower_p(wins, losses, n, d) <= tail, estimate, 1.0 - 1e-12)
    return low, high


@lru_cache(maxsize=256)
def _critical(n: int, margin: float, alpha: float) -> float:
    """The largest Z that lower_p at +margin rejects at ``alpha``, to 1e-9 (NaN: none): lower_p rises
    with the observed Z, so the test rejects exactly the Z at or below it. For simulating many
    replicates at once."""
    if _lower_tail(-math.inf, n, margin) > alpha:
        return math.nan  # not even every problem tied: no Z rejects (and NaN compares false)
    low, high = -40.0, 40.0
    if _lower_tail(low, n, margin) > alpha:
        high = low
        low = -1e6
    while high - low > 1e-9:
        middle = (low + high) / 2
        low, high = (middle, high) if _lower_tail(middle, n, margin) <= alpha else (low, middle)
    return low


def equivalent(wins: np.ndarray, losses: np.ndarray, n: int, margin: float, alpha: float) -> np.ndarray:
    """Whether equivalence_p(W, L, n, margin) ≤ alpha, for arrays of counts (the same decision, through
    the critical value of each one-sided test)."""
    critical = _critical(n, margin, alpha)
    below = _z(wins, wins + losses, n, margin) <= critical
    above = _z(losses, wins + losses, n, margin) <= critical  # the mirror: H0 Δ ≤ −margin
    return below & above

"""The exact unconditional tests of a paired pass/fail difference, by enumeration of every outcome: what
kvbench.results.exact_pairs computes, written apart from it for the tests to compare with."""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln, xlogy


def score(wins: np.ndarray, losses: np.ndarray, n: int, null: float) -> np.ndarray:
    """Tango's score statistic for Δ = p(win) − p(loss) = ``null``, written out from its likelihood."""
    a, b, c = 2 * n, -(wins + losses) + null * (2 * n - wins + losses), -losses * null * (1 - null)
    q = (-b + np.sqrt(b * b - 4 * a * c)) / (2 * a)  # the loss probability's restricted MLE
    variance = n * (2 * q + null - null**2)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (wins - losses - n * null) / np.sqrt(variance)
    return np.where(variance > 0, z, 0.0)


def tail(wins: int, losses: int, n: int, null: float, upper: bool, grid: int = 801) -> float:
    """sup over the discordance (a grid of ``grid`` points) of P(Z ≥ observed) (``upper``) or
    P(Z ≤ observed) when Δ = ``null``: every (W, L) of n problems, its trinomial probability."""
    w, lost = (a.ravel() for a in np.meshgrid(np.arange(n + 1), np.arange(n + 1)))
    w, lost = w[w + lost <= n], lost[w + lost <= n]
    log_ways = gammaln(n + 1) - gammaln(w + 1) - gammaln(lost + 1) - gammaln(n - w - lost + 1)
    observed = score(np.array(wins), np.array(losses), n, null)
    z = score(w, lost, n, null)
    inside = z >= observed - 1e-9 if upper else z <= observed + 1e-9
    best = 0.0
    for d in np.linspace(max(abs(null), 1e-9), 1.0, grid):
        up, down = (d + null) / 2, (d - null) / 2
        log_p = log_ways + xlogy(w, up) + xlogy(lost, down) + xlogy(n - w - lost, 1 - d)
        best = max(best, float(np.exp(log_p[inside]).sum()))
    return min(1.0, best)


def tost_by_hand(wins: int, ties: int, losses: int, margin: float) -> float:
    """The exact TOST: the larger of the p-values of Δ ≤ −margin and Δ ≥ +margin."""
    n = wins + ties + losses
    return max(tail(wins, losses, n, -margin, True), tail(wins, losses, n, margin, False))


def mean_p_by_hand(wins: int, ties: int, losses: int) -> float:
    """The exact two-sided test of Δ = 0 (twice the smaller tail)."""
    n = wins + ties + losses
    return min(1.0, 2 * min(tail(wins, losses, n, 0.0, True), tail(wins, losses, n, 0.0, False)))

"""The problems a decided verdict needs, planned from the observed paired differences: which test decides
(the sign test outside the margin, the equivalence test inside it), how many problems give it 80% power
(checked by simulating kvbench's own verdicts), and no count at all where no problem differs."""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pytest
from scipy import integrate
from scipy.stats import binom, binomtest, chi2, norm
from scipy.stats import t as student_t

from kvbench.results.stats import (
    ALPHA,
    POWER,
    compare_arms,
    equivalence_power,
    plan_decision,
    verdicts,
)

MARGIN = 0.02  # the protocol's default


def pass_fail(wins: int, ties: int, losses: int) -> tuple[dict[str, float], dict[str, float]]:
    """One pass/fail sample per problem: the arm alone passes (win), both pass (tie) or the null alone."""
    outcomes = [1] * wins + [0] * ties + [-1] * losses
    arm = {f"p{i}": float(o >= 0) for i, o in enumerate(outcomes)}
    null = {f"p{i}": float(o <= 0) for i, o in enumerate(outcomes)}
    return arm, null


def sign_power_by_hand(problems: int, win: float, loss: float) -> float:
    """P(scipy's two-sided binomtest rejects with more wins than losses), summed over every (differing,
    wins) count of ``problems`` problems each won with probability ``win`` and lost with ``loss``."""
    total = 0.0
    for differing in range(problems + 1):
        for won in range(differing // 2 + 1, differing + 1):
            if binomtest(won, differing).pvalue < ALPHA:
                total += binom.pmf(differing, problems, win + loss) * binom.pmf(
                    won, differing, win / (win + loss)
                )
    return total


def test_the_figure_follows_what_was_observed_not_only_the_discordance() -> None:
    """The issue's cases: 4 losses, 4 wins and 8 wins to 2 all got "19765 problems to detect ±0.02"."""
    losing, winning, mostly = (
        compare_arms(*pass_fail(*counts), MARGIN, draws=1) for counts in [(0, 0, 4), (4, 0, 0), (8, 0, 2)]
    )
    # were every problem lost (won), the sign test rejects as soon as n of n can: 2 · 0.5^n < 0.05
    fewest = next(n for n in range(1, 20) if binomtest(0, n).pvalue < ALPHA)
    assert fewest == 6
    assert (losing.plan.decision, losing.problems_needed) == ("loses to null", fewest)
    assert (winning.plan.decision, winning.problems_needed) == ("beats null", fewest)
    needed = mostly.problems_needed
    assert mostly.plan.decision == "beats null" and needed is not None
    assert sign_power_by_hand(needed, 0.8, 0.2) >= POWER > sign_power_by_hand(needed // 2, 0.8, 0.2)


def test_no_count_where_no_problem_differs() -> None:
    """Every arm scored 0 on every problem: the old figure was 394 problems; more problems of the same
    probe stay tied, and a row of zeros is no spread for an equivalence test to plan with."""
    zeros = compare_arms(
        dict.fromkeys(["a", "b", "c", "d"], 0.0), dict.fromkeys(["a", "b", "c", "d"], 0.0), MARGIN
    )
    assert (zeros.wins, zeros.losses) == (0, 0)
    assert zeros.plan is not None and (zeros.plan.decision, zeros.problems_needed) == (None, None)


def test_inside_the_margin_the_equivalence_test_is_planned() -> None:
    """Mean +0.005 inside ±0.02 with a symmetric spread (as many wins as losses): the sign test cannot
    decide, the equivalence test can; outside the margin with balanced signs neither can."""
    arm = {f"p{i}": 0.5 + d for i, d in enumerate([0.03, -0.02, 0.01, -0.01, 0.025, -0.005])}
    null = dict.fromkeys(arm, 0.5)
    inside = compare_arms(arm, null, MARGIN, draws=1)
    assert inside.wins == inside.losses and abs(inside.difference.value) < MARGIN
    assert inside.plan.decision == "equivalent to null" and inside.problems_needed > 6
    shifted = compare_arms({p: v + 0.05 for p, v in arm.items()}, {p: 0.5 + 0.05 + 0.0 for p in arm}, MARGIN)
    assert shifted.plan.decision == "equivalent to null"  # the same differences: the same plan
    outside = plan_decision(0.5, 0.5, 0.05, 0.3, MARGIN)
    assert outside is not None and (outside.decision, outside.problems) == (None, None)


@pytest.mark.parametrize(
    ("problems", "mean", "spread", "margin"),
    [
        (2, 0.0, 0.001, 0.02),
        (10, 0.0, 0.02, 0.02),
        (27, 0.005, 0.03, 0.02),
        (400, -0.01, 0.08, 0.02),
        (3, 0.01, 0.02, 0.02),
    ],
)
def test_equivalence_power_is_the_integral_over_the_sample_deviation(
    problems: int, mean: float, spread: float, margin: float
) -> None:
    """The same power written another way: integrated over S (scipy's χ² density, not its quantiles)."""
    df, root = problems - 1, math.sqrt(problems)
    t = student_t.isf(ALPHA, df)

    def given(s: float) -> float:  # P(the mean's interval fits inside ±margin | S = s)
        half = t * s / root
        inside = norm.cdf(margin - half, mean, spread / root) - norm.cdf(half - margin, mean, spread / root)
        return max(0.0, inside) * chi2.pdf(df * s**2 / spread**2, df) * 2 * df * s / spread**2

    widest = margin * root / t  # beyond this S the interval is wider than the margins
    expected = integrate.quad(given, 0, widest, limit=500, epsabs=1e-11, points=[min(spread, widest / 2)])[0]
    assert equivalence_power(problems, mean, spread, margin) == pytest.approx(expected, abs=1e-6)


# -- simulation: kvbench's own verdicts at the planned number of problems -----------------------------------
REPLICATES = 2000
SEED = 20240531
TOLERANCE = norm.isf(0.0005) * math.sqrt(POWER * (1 - POWER) / REPLICATES)
"""Two-sided 99.9% binomial band around 80% for 2,000 replicates: ±0.029."""

Draw = Callable[[np.random.Generator, int], np.ndarray]


def verdict_shares(draw: Draw, problems: int, margin: float, seed: int) -> Counter[str]:
    """Each replicate: ``problems`` differences drawn, each problem scored max(d, 0) by the arm and
    max(-d, 0) by the null (a pass/fail difference of +1 is 1 against 0), then judged alone in its table
    by compare_arms and verdicts; the share of each verdict."""
    rng = np.random.default_rng(seed)
    tally: Counter[str] = Counter()
    for _ in range(REPLICATES):
        differences = draw(rng, problems)
        arm = {f"p{i}": max(d, 0.0) for i, d in enumerate(differences)}
        null = {f"p{i}": max(-d, 0.0) for i, d in enumerate(differences)}
        (judged,) = verdicts([compare_arms(arm, null, margin, draws=999)])
        tally[judged.verdict] += 1
    return Counter({verdict: count / REPLICATES for verdict, count in tally.items()})


def pass_fail_draw(win: float, loss: float) -> Draw:
    return lambda rng, n: rng.choice([1.0, 0.0, -1.0], size=n, p=[win, 1 - win - loss, loss])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("draw", "truth", "margin", "decision"),
    [
        # a pass/fail task: 30% of problems won, 10% lost; the mean +0.2 lies outside the margin
        (pass_fail_draw(0.3, 0.1), (0.3, 0.1, 0.2, math.sqrt(0.4 - 0.2**2)), MARGIN, "beats null"),
        # a continuous metric, differences normal around 0 (spread enough that the plan lies above the
        # 30-problem floor): the bootstrap-t behaves as the t-test the plan assumes
        (lambda rng, n: rng.normal(0.0, 0.05, n), (0.5, 0.5, 0.0, 0.05), MARGIN, "equivalent to null"),
        # (pass/fail differences inside the margin are tested exactly, and problems_needed plans them with
        # the normal formula: not checked here until that plan is exact)
    ],
    ids=["sign test, pass/fail", "equivalence, normal"],
)
def test_the_planned_problems_give_80_percent_of_decided_verdicts(
    draw: Draw, truth: tuple[float, float, float, float], margin: float, decision: str
) -> None:
    """Planned from the distribution's own shares won and lost, mean and standard deviation (what an
    observed row would show were it the truth): at n problems the decision the plan names comes out in
    80% ± TOLERANCE of 2,000 replicates, at n/2 in clearly fewer. The other decided verdicts stay near
    the sign test's level (they come only from chance here), so every decided verdict together is 80%
    too, give or take α."""
    plan = plan_decision(*truth, margin)
    assert plan is not None and plan.decision == decision and plan.problems is not None
    at = verdict_shares(draw, plan.problems, margin, SEED)
    half = verdict_shares(draw, plan.problems // 2, margin, SEED + 1)
    assert abs(at[decision] - POWER) <= TOLERANCE, (plan, at)
    decided = 1 - at["inconclusive"]
    assert POWER - TOLERANCE <= decided <= POWER + TOLERANCE + ALPHA, (plan, at)
    assert 1 - half["inconclusive"] < POWER - TOLERANCE, (plan, half)


def test_a_probe_on_which_every_arm_scores_0_shows_no_count(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`kvbench compare` on a stored probe where the null, the full cache and both policies score 0 on
    every problem (passkey at a K where nothing is retrieved): one line that no count exists, no
    figure, in the terminal table's notes and in the CSV's columns."""
    from kvbench.bench.leaderboard import synthetic_store
    from kvbench.cli import main
    from kvbench.results.compare import NO_DIFFERENCE

    database = tmp_path / "store.duckdb"
    synthetic_store(database, policies=2, tasks=1, problems=8, samples=1)
    with duckdb.connect(str(database)) as con:
        con.execute("UPDATE samples SET metric = 0, correct = false")
    assert main(["compare", "--db", str(database)]) == 0
    out = capsys.readouterr().out
    assert NO_DIFFERENCE in " ".join(out.split())
    assert "problems would give" not in out and "power:" not in out
    assert main(["compare", "--db", str(database), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["policy"], r["wins"], r["losses"], r["verdict"]) for r in rows] == [
        ("policy-00", "0", "0", "inconclusive"),
        ("policy-01", "0", "0", "inconclusive"),
    ]
    assert {(r["problems_needed"], r["problems_needed_for"]) for r in rows} == {("", "")}


def exact_equivalence_power(problems: int, win: float, loss: float, margin: float) -> float:
    """P(the exact TOST declares equivalence) on ``problems`` pass/fail problems each won with
    probability ``win`` and lost with ``loss``: every (differing, wins) count's trinomial probability
    summed where kvbench's exact test decides (counts of probability under 1e-14 left out)."""
    from kvbench.results.exact_pairs import equivalent

    total = 0.0
    discordance = win + loss
    for differing in range(problems + 1):
        weight = binom.pmf(differing, problems, discordance)
        if weight < 1e-14:
            continue
        won = np.arange(differing + 1)
        decided = equivalent(won, differing - won, problems, margin, ALPHA)
        total += weight * binom.pmf(won, differing, win / discordance)[decided].sum()
    return float(total)


@pytest.mark.slow
@pytest.mark.parametrize(("win", "loss"), [(0.02, 0.02), (0.05, 0.05)])
def test_the_pass_fail_equivalence_plan_is_a_normal_approximation_a_little_short(
    win: float, loss: float
) -> None:
    """A pass/fail metric's equivalence count is planned with the t-test's power, not the exact test's:
    at the planned count the exact test's power, enumerated, is below 80% but by no more than the
    shortfall docs/limitations.md states (6 points, at discordance 0.04)."""
    mean, spread = win - loss, math.sqrt(win + loss - (win - loss) ** 2)
    plan = plan_decision(win, loss, mean, spread, MARGIN, exact=True)
    assert plan is not None and plan.decision == "equivalent to null" and plan.problems is not None
    power = exact_equivalence_power(plan.problems, win, loss, MARGIN)
    assert POWER - 0.06 <= power < POWER, (plan, power)

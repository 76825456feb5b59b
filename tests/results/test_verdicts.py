"""Verdicts as a reader sees them, recomputed independently from SQL-derived per-problem differences: a
losing policy, a winning one, one identical to the null, and one whose verdict only Holm's correction
changes (compare and the leaderboard alike)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest
from exact_by_hand import mean_p_by_hand, tost_by_hand
from scipy.stats import binomtest

from kvbench.bench.leaderboard import synthetic_store
from kvbench.leaderboard import queries
from kvbench.results.compare import Filters, compare

PROBLEMS = 40
# per problem p: the null scores p % 2; each policy's score as a SQL expression of p
SCORES = {
    "random": "p % 2",
    "policy-00": "0",  # loses every one of the 20 problems it does not tie
    "policy-01": "1",  # wins all 20
    "policy-02": "p % 2",  # ties everything: 40 problems cannot show equivalence within ±0.02
    "policy-03": "CASE WHEN p < 24 THEN 1 WHEN p < 30 THEN 0 ELSE p % 2 END",  # 12 wins, 3 losses
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    database = tmp_path_factory.mktemp("verdicts") / "store.duckdb"
    synthetic_store(database, policies=4, tasks=1, problems=PROBLEMS, samples=1)
    con = duckdb.connect(str(database))
    for policy, expression in SCORES.items():
        con.execute(
            f"UPDATE samples SET metric = (SELECT {expression} FROM (SELECT "
            "CAST(substr(problem_id, 2) AS INTEGER) AS p)) WHERE run_id = ?",
            [f"00-{policy}"],
        )
    # every arm, the full cache too, generates its own lengths and is cut at the cap on its own problems
    for index, policy in enumerate([*SCORES, "full"]):
        con.execute(
            "UPDATE samples SET correct = metric > 0, generated_tokens = 100 + (hash(problem_id) % 37) * "
            f"{index + 1} + 10 * {index}, finish_reason = CASE WHEN hash(problem_id) % {index + 3} = 0 "
            "THEN 'length' ELSE 'stop' END WHERE run_id = ?",
            [f"00-{policy}"],
        )
    con.close()
    return database


MARGIN = 0.02  # the default of a protocol that declares none (the synthetic store's)


def _holm(raw: dict[str, float]) -> dict[str, float]:
    ordered = sorted(raw, key=raw.get)
    adjusted, running = {}, 0.0
    for rank, policy in enumerate(ordered):
        running = max(running, (len(ordered) - rank) * raw[policy])
        adjusted[policy] = min(1.0, running)
    return adjusted


def differences(database: Path) -> dict[str, np.ndarray]:
    """Per policy, its per-problem score minus the null's, from SQL, by problem id."""
    con = duckdb.connect(str(database), read_only=True)
    rows = con.execute(
        """
        WITH per AS (SELECT r.policy, s.problem_id, avg(s.metric) AS score
                     FROM samples s JOIN runs r USING (run_id) GROUP BY ALL)
        SELECT a.policy, list(a.score - n.score ORDER BY a.problem_id)
        FROM per a JOIN per n ON a.problem_id = n.problem_id AND n.policy = 'random'
        WHERE a.policy LIKE 'policy-%' GROUP BY a.policy ORDER BY a.policy
        """
    ).fetchall()
    con.close()
    return {policy: np.array(values) for policy, values in rows}


def _difference_p(wins: int, losses: int) -> float:
    """The sign test and the exact test of the mean (pass/fail differences: Δ = (W − L)/n) agreeing:
    the larger p."""
    sign = binomtest(wins, wins + losses, 0.5).pvalue if wins + losses else 1.0
    return max(sign, mean_p_by_hand(wins, PROBLEMS - wins - losses, losses)) if wins != losses else 1.0


def independent(database: Path) -> dict[str, tuple[int, int, float, str]]:
    """(wins, losses, Holm-adjusted p, verdict) per policy, from SQL and scipy, Holm and the exact tests
    written out here."""
    deltas = differences(database)
    counts = {policy: (int((d > 0).sum()), int((d < 0).sum())) for policy, d in deltas.items()}
    adjusted = _holm({p: _difference_p(w, n) for p, (w, n) in counts.items()})
    equivalent = _holm({p: tost_by_hand(w, PROBLEMS - w - n, n, MARGIN) for p, (w, n) in counts.items()})
    out = {}
    for policy, (wins, losses) in counts.items():
        verdict = "inconclusive"
        if adjusted[policy] < 0.05 and equivalent[policy] < 0.05:
            verdict = "practically equivalent"
        elif adjusted[policy] < 0.05:
            verdict = "beats null" if wins > losses else "loses to null"
        elif equivalent[policy] < 0.05:
            verdict = "equivalent to null"
        out[policy] = (wins, losses, adjusted[policy], verdict)
    return out


def test_the_expected_verdicts_cover_every_direction(store: Path) -> None:
    expected = independent(store)
    assert {p: v[3] for p, v in expected.items()} == {
        "policy-00": "loses to null",
        "policy-01": "beats null",
        "policy-02": "inconclusive",
        "policy-03": "inconclusive",  # p = 0.035 uncorrected: only Holm's correction makes it inconclusive
    }
    assert binomtest(12, 15, 0.5).pvalue < 0.05 < expected["policy-03"][2]


def test_compare_verdicts_and_holm_p_values(store: Path) -> None:
    expected = independent(store)
    rows = {r["policy"]: r for r in compare(store, Filters())}
    for policy, (wins, losses, p_holm, verdict) in expected.items():
        row = rows[policy]
        assert (row["wins"], row["losses"], row["verdict"]) == (wins, losses, verdict)
        assert row["p_holm"] == pytest.approx(p_holm, rel=1e-3)


def test_leaderboard_verdicts_and_holm_p_values(store: Path) -> None:
    expected = independent(store)
    frame = queries.leaderboard(store, "synthetic", "protect-prompt", queries.Compression(4.0, None)).frame
    rows = frame.set_index("policy")
    badge = {"beats null": "beats null", "inconclusive": "inconclusive", "loses to null": "loses"}
    for policy, (wins, losses, p_holm, verdict) in expected.items():
        assert rows.loc[policy, "verdict"] == badge[verdict]
        assert rows.loc[policy, "p (Holm)"] == pytest.approx(p_holm, rel=1e-3)
        assert rows.loc[policy, "W/T/L"] == f"{wins}/{PROBLEMS - wins - losses}/{losses}"


def independent_tokens(database: Path) -> dict[str, tuple[float, float, float, float, float]]:
    """(tokens × full, tokens per correct, Δ tokens, Δ truncation, Δ tokens per correct vs the null) per
    policy, straight from SQL: per-problem means first, problems as the unit."""
    con = duckdb.connect(str(database), read_only=True)
    rows = con.execute(
        """
        WITH per AS (SELECT r.policy, s.problem_id, avg(s.generated_tokens) AS tokens,
                            avg((s.finish_reason = 'length')::INTEGER) AS cut
                     FROM samples s JOIN runs r USING (run_id) GROUP BY ALL),
             cell AS (SELECT r.policy,
                             sum(s.generated_tokens) / nullif(sum(s.correct::INTEGER), 0) AS per_correct
                      FROM samples s JOIN runs r USING (run_id) GROUP BY ALL)
        SELECT a.policy, avg(a.tokens) / avg(f.tokens), any_value(c.per_correct),
               avg(a.tokens - n.tokens), avg(a.cut - n.cut), any_value(c.per_correct - cn.per_correct)
        FROM per a JOIN per n ON a.problem_id = n.problem_id AND n.policy = 'random'
                   JOIN per f ON a.problem_id = f.problem_id AND f.policy = 'full'
                   JOIN cell c ON c.policy = a.policy JOIN cell cn ON cn.policy = 'random'
        WHERE a.policy LIKE 'policy-%' GROUP BY a.policy
        """
    ).fetchall()
    con.close()
    # no correct answer: no tokens per correct answer (NULL from SQL, NaN in the table)
    return {policy: tuple(float("nan") if v is None else v for v in values) for policy, *values in rows}


def test_compare_shows_what_compression_costs_in_tokens(store: Path) -> None:
    expected = independent_tokens(store)
    rows = {r["policy"]: r for r in compare(store, Filters())}
    fields = (
        "lengthening",
        "tokens_per_correct",
        "delta_tokens",
        "delta_truncation",
        "delta_tokens_per_correct",
    )
    for policy, values in expected.items():
        assert tuple(rows[policy][f] for f in fields) == pytest.approx(values, rel=1e-9, nan_ok=True), policy
    assert len({v[0] for v in expected.values()}) == len(expected)  # the arms really differ
    frame = queries.leaderboard(store, "synthetic", "protect-prompt", queries.Compression(4.0, None)).frame
    shown = frame.set_index("policy")
    for policy, (lengthening, per_correct, tokens, cut, _) in expected.items():
        assert shown.loc[policy, "tokens × full"] == pytest.approx(lengthening, rel=1e-9)
        assert shown.loc[policy, "tokens / correct"] == pytest.approx(per_correct, rel=1e-9, nan_ok=True)
        assert shown.loc[policy, "Δ tokens vs null"] == pytest.approx(tokens, rel=1e-9)
        assert shown.loc[policy, "Δ trunc vs null"] == pytest.approx(cut, rel=1e-9)


def test_margin_power_and_problems_needed_are_shown(store: Path) -> None:
    """The margin (the protocol's default), the minimum detectable effect and, beside *inconclusive*,
    what would decide it at the observed differences: read back from compare, its Markdown, the notes
    under the terminal table and the leaderboard. policy-03 (12 wins, 3 losses, mean +0.225, outside
    ±0.02) is planned by the sign test, to beat; policy-02 ties every problem: no count."""
    from kvbench.results.compare import display_cells, power_notes, render
    from kvbench.results.stats import minimum_detectable_effect, plan_decision

    rows = {r["policy"]: r for r in compare(store, Filters())}
    frame = queries.leaderboard(store, "synthetic", "protect-prompt", queries.Compression(4.0, None)).frame
    shown = frame.set_index("policy")
    for policy, (wins, losses, _, _) in independent(store).items():
        row = rows[policy]
        discordance = (wins + losses) / PROBLEMS
        assert row["margin"] == MARGIN and shown.loc[policy, "margin"] == MARGIN
        mde = minimum_detectable_effect(PROBLEMS, discordance)
        assert row["minimum_detectable_effect"] == mde
        assert f"±{MARGIN:g}" in display_cells(row)[-2]
    deltas = differences(store)["policy-03"]
    wins, losses = (deltas > 0).mean(), (deltas < 0).mean()
    plan = plan_decision(wins, losses, deltas.mean(), deltas.std(ddof=1), MARGIN)
    assert plan is not None and plan.decision == "beats null"
    row = rows["policy-03"]
    assert (row["problems_needed"], row["problems_needed_for"]) == (plan.problems, "beats null")
    assert display_cells(row)[-3].endswith(f"; 80% power: {plan.problems} problems to beat")
    assert shown.loc["policy-03", "problems for 80% power"] == f"{plan.problems} problems to beat"
    tied = rows["policy-02"]
    assert (tied["problems_needed"], tied["problems_needed_for"]) == (None, None)
    assert display_cells(tied)[-3].endswith("; 80% power: no problem differs")
    assert shown.loc["policy-02", "problems for 80% power"] == "no problem differs"
    assert power_notes(list(rows.values())) == [
        "Holm over 4 comparisons: the policies of the task-0 table at K=256, against random",
        f"equivalence margin ±{MARGIN:g}: protocol protect-prompt: margin",
        "policy-02: inconclusive; no problem differs from the null at this K: more problems of this "
        "probe cannot separate them",
        f"policy-03: inconclusive; {plan.problems} problems would give 80% power to decide 'beats null'",
    ]
    # 20 differing problems of 40: the smallest effect 80% power reaches lies between 0 and 0.5
    assert 0.2 < rows["policy-03"]["minimum_detectable_effect"] < 0.5
    assert "inconclusive" in render(list(rows.values()), "markdown")
    assert '"margin": 0.02' in render(list(rows.values()), "json")
    assert "problems_needed" in render(list(rows.values()), "csv").splitlines()[0]

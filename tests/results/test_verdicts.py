"""Verdicts as a reader sees them, recomputed independently from SQL-derived wins and losses: a losing
policy, a winning one, a tie, and one whose verdict only Holm's correction changes (compare and the
leaderboard alike)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
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
    "policy-02": "p % 2",  # ties everything
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
    con.close()
    return database


def independent(database: Path) -> dict[str, tuple[int, int, float, str]]:
    """(wins, losses, Holm-adjusted p, verdict) per policy, from SQL and scipy, Holm written out here."""
    con = duckdb.connect(str(database), read_only=True)
    counts = con.execute(
        """
        WITH per AS (SELECT r.policy, s.problem_id, avg(s.metric) AS score
                     FROM samples s JOIN runs r USING (run_id) GROUP BY ALL)
        SELECT a.policy, count(*) FILTER (WHERE a.score > n.score), count(*) FILTER (WHERE a.score < n.score)
        FROM per a JOIN per n ON a.problem_id = n.problem_id AND n.policy = 'random'
        WHERE a.policy LIKE 'policy-%' GROUP BY a.policy ORDER BY a.policy
        """
    ).fetchall()
    con.close()
    raw = {policy: binomtest(w, w + n, 0.5).pvalue if w + n else 1.0 for policy, w, n in counts}
    ordered = sorted(raw, key=raw.get)
    adjusted, running = {}, 0.0
    for rank, policy in enumerate(ordered):
        running = max(running, (len(ordered) - rank) * raw[policy])
        adjusted[policy] = min(1.0, running)
    out = {}
    for policy, wins, losses in counts:
        verdict = "ties null"
        if adjusted[policy] < 0.05:
            verdict = "beats null" if wins > losses else "loses to null"
        out[policy] = (wins, losses, adjusted[policy], verdict)
    return out


def test_the_expected_verdicts_cover_every_direction(store: Path) -> None:
    expected = independent(store)
    assert {p: v[3] for p, v in expected.items()} == {
        "policy-00": "loses to null",
        "policy-01": "beats null",
        "policy-02": "ties null",
        "policy-03": "ties null",  # p = 0.035 uncorrected: only Holm's correction makes it a tie
    }
    assert binomtest(12, 15, 0.5).pvalue < 0.05 < expected["policy-03"][2]


def test_compare_verdicts_and_holm_p_values(store: Path) -> None:
    expected = independent(store)
    rows = {r["policy"]: r for r in compare(store, Filters())}
    for policy, (wins, losses, p_holm, verdict) in expected.items():
        row = rows[policy]
        assert (row["wins"], row["losses"], row["verdict"]) == (wins, losses, verdict)
        assert row["p_holm"] == pytest.approx(p_holm, rel=1e-9)


def test_leaderboard_verdicts_and_holm_p_values(store: Path) -> None:
    expected = independent(store)
    frame = queries.leaderboard(store, "synthetic", "protect-prompt", queries.Compression(4.0, None)).frame
    rows = frame.set_index("policy")
    badge = {"beats null": "beats null", "ties null": "ties", "loses to null": "loses"}
    for policy, (wins, losses, p_holm, verdict) in expected.items():
        assert rows.loc[policy, "verdict"] == badge[verdict]
        assert rows.loc[policy, "p (Holm)"] == pytest.approx(p_holm, rel=1e-9)
        assert rows.loc[policy, "W/T/L"] == f"{wins}/{PROBLEMS - wins - losses}/{losses}"

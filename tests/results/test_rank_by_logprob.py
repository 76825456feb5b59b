"""Ranking by the probe answer's log-probability: `kvbench compare --metric answer-logprob` and the
leaderboard pair each policy with the null on it, recomputed here from the samples table and scipy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from invoke import kvbench
from scipy.stats import binomtest

from kvbench.errors import UnknownNameError
from kvbench.leaderboard import queries
from kvbench.leaderboard.queries import Compression
from kvbench.results.summary import QUANTITIES, summarize
from support import holm_by_definition

KVBENCH = str(Path(sys.executable).parent / "kvbench")
POLICIES = ("snapkv", "h2o", "streaming")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("logprob")
    args = ["run", "--model", "tiny-qwen3", "--task", "passkey", "--limit", "6", "--quiet"]
    for policy in POLICIES:
        args += ["--policy", policy]
    done = kvbench(*args, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def sql_pairs(database: Path, policy: str) -> tuple[float, int, int]:
    """Mean over problems of the policy's answer log-probability minus the null's, wins and losses."""
    con = duckdb.connect(str(database), read_only=True)
    found = con.execute(
        """
        WITH per AS (
            SELECT r.policy, r.role, s.problem_id, avg(s.answer_logprob) AS lp
            FROM samples s JOIN runs r USING (run_id) GROUP BY ALL)
        SELECT avg(p.lp - n.lp), count_if(p.lp > n.lp), count_if(p.lp < n.lp)
        FROM per p JOIN per n USING (problem_id)
        WHERE p.policy = ? AND p.role = 'policy' AND n.role = 'null'
        """,
        [policy],
    ).fetchone()
    con.close()
    return found


def test_compare_and_the_leaderboard_pair_on_the_answer_logprob(root: Path) -> None:
    database, snapshot = root / "runs" / "kvbench.duckdb", root / "runs" / "kvbench.snapshot.duckdb"
    done = subprocess.run(
        [KVBENCH, "compare", "--metric", "answer-logprob", "--format", "json"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = {r["policy"]: r for r in json.loads(done.stdout)}
    expected = {policy: sql_pairs(database, policy) for policy in POLICIES}
    adjusted = holm_by_definition(
        [binomtest(w, w + lo, 0.5).pvalue if w + lo else 1.0 for _, w, lo in expected.values()]
    )
    board = queries.leaderboard(
        snapshot, "tiny-qwen3", "protect-prompt", Compression(4.0, None), quantity="answer-logprob"
    ).frame.set_index("policy")
    for (policy, (delta, wins, losses)), p_holm in zip(expected.items(), adjusted, strict=True):
        row = rows[policy]
        assert row["delta"] == pytest.approx(delta, abs=1e-9)
        assert (row["wins"], row["losses"]) == (wins, losses)
        assert row["p_holm"] == pytest.approx(p_holm, rel=1e-9)
        assert board.loc[policy, "Δ vs null"] == pytest.approx(delta, abs=1e-9)
    # log-probabilities are negative and differ between arms: this is not the exact-retrieval score
    assert all(r["score"] < 0 for r in rows.values())
    assert len({round(d, 6) for d, _, _ in expected.values()}) == len(POLICIES)
    by_score = json.loads(
        subprocess.run(
            [KVBENCH, "compare", "--format", "json"], capture_output=True, text=True, cwd=root, timeout=300
        ).stdout
    )
    assert all(0.0 <= r["score"] <= 1.0 for r in by_score)


def test_an_unknown_quantity_lists_the_known_ones(root: Path) -> None:
    con = duckdb.connect(str(root / "runs" / "kvbench.duckdb"), read_only=True)
    with pytest.raises(UnknownNameError) as caught:
        summarize(con, ["x"], "answer_logprob; DROP TABLE samples")
    con.close()
    assert "score" in str(caught.value) and "answer-logprob" in str(caught.value)
    done = subprocess.run([KVBENCH, "compare", "--help"], capture_output=True, text=True, timeout=60)
    assert "{" + ",".join(QUANTITIES) + "}" in done.stdout  # the CLI offers exactly these

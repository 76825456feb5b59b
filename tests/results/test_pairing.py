"""A policy is only ever paired with the null of its own protocol seed, runtime and samples per problem:
two seeds in one store, read through `compare`, `kvbench run`'s table and the leaderboard."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import duckdb
import pytest
from invoke import kvbench

from kvbench.leaderboard import queries
from kvbench.leaderboard.queries import Compression

COMMON = ["--model", "tiny-qwen3", "--task", "fidelity", "--limit", "3", "--quiet"]


def run_kvbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = kvbench(*args, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def sql_delta(database: Path, policy: str, seed: int) -> float:
    """Mean over problems of policy − null, both under ``seed``, straight from the samples table."""
    con = duckdb.connect(str(database), read_only=True)
    value = con.execute(
        """
        WITH per AS (
            SELECT r.policy, s.problem_id, avg(s.metric) AS score FROM samples s JOIN runs r USING (run_id)
            WHERE r.protocol_seed = ? AND r.policy IN (?, 'random') GROUP BY ALL)
        SELECT avg(p.score - n.score) FROM per p JOIN per n USING (problem_id)
        WHERE p.policy = ? AND n.policy = 'random'
        """,
        [seed, policy, policy],
    ).fetchone()[0]
    con.close()
    return value


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("seeds")
    run_kvbench("run", *COMMON, "--policy", "snapkv", cwd=root)
    second = run_kvbench("run", *COMMON, "--policy", "h2o", "--seed", "7", "--json", "table.json", cwd=root)
    run_kvbench("run", *COMMON, "--policy", "streaming", "--seed", "3", "--no-baselines", cwd=root)
    return root, json.loads((root / "table.json").read_text()) | {"stdout": second.stdout}


def test_the_two_nulls_differ_so_a_wrong_pairing_would_show(two_seeds: tuple[Path, dict]) -> None:
    root, _ = two_seeds
    database = root / "runs" / "kvbench.duckdb"
    con = duckdb.connect(str(database), read_only=True)
    nulls = con.execute(
        "SELECT r.protocol_seed, avg(s.metric) FROM samples s JOIN runs r USING (run_id) "
        "WHERE r.policy = 'random' GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    con.close()
    assert [seed for seed, _ in nulls] == [0, 7] and nulls[0][1] != nulls[1][1]


def test_compare_pairs_each_policy_with_its_own_seeds_null(two_seeds: tuple[Path, dict]) -> None:
    root, _ = two_seeds
    rows = json.loads(run_kvbench("compare", "--format", "json", cwd=root).stdout)
    by_policy = {r["policy"]: r for r in rows}
    database = root / "runs" / "kvbench.duckdb"
    assert by_policy["snapkv"]["seed"] == 0 and by_policy["h2o"]["seed"] == 7
    assert by_policy["snapkv"]["delta"] == pytest.approx(sql_delta(database, "snapkv", 0), abs=1e-12)
    assert by_policy["h2o"]["delta"] == pytest.approx(sql_delta(database, "h2o", 7), abs=1e-12)
    # a policy whose seed has no null is shown as such, never paired with another seed's
    assert by_policy["streaming"]["seed"] == 3
    assert by_policy["streaming"]["verdict"] == "no matching baseline"
    assert by_policy["streaming"]["delta"] is None and by_policy["streaming"]["wins"] is None
    markdown = run_kvbench("compare", "--format", "markdown", cwd=root).stdout
    (line,) = [r for r in markdown.splitlines() if "| streaming |" in r]
    assert "| no matching baseline |" in line and "seed 3" in line


def test_the_run_table_pairs_with_its_own_seed(two_seeds: tuple[Path, dict]) -> None:
    root, table = two_seeds
    h2o = next(r for r in table["rows"] if r["policy"] == "h2o")
    expected = sql_delta(root / "runs" / "kvbench.duckdb", "h2o", 7)
    assert h2o["delta"] == pytest.approx(expected, abs=1e-12)


def test_the_leaderboard_pairs_within_one_seed(two_seeds: tuple[Path, dict]) -> None:
    root, _ = two_seeds
    snapshot = root / "runs" / "kvbench.snapshot.duckdb"
    database = root / "runs" / "kvbench.duckdb"
    choices = queries.choices(snapshot, "tiny-qwen3", "protect-prompt")
    assert choices.seeds == [0, 3, 7]
    at = Compression(4.0, None)
    for seed, policy in ((0, "snapkv"), (7, "h2o")):
        frame = queries.leaderboard(snapshot, "tiny-qwen3", "protect-prompt", at, seed=seed).frame
        row = frame.set_index("policy").loc[policy]
        assert set(frame["policy"]) == {policy, "random", "full"}
        assert row["Δ vs null"] == pytest.approx(sql_delta(database, policy, seed), abs=1e-12)
    lonely = queries.leaderboard(snapshot, "tiny-qwen3", "protect-prompt", at, seed=3).frame
    assert lonely[["policy", "verdict"]].values.tolist() == [["streaming", "no matching null"]]

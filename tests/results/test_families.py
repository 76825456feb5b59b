"""Holm families: `kvbench compare` corrects each table's policies together (`--family table`), or every
task and budget of a sweep together (`--family sweep`); pooled tables form a family of their own, so the
per-task rows' corrections never count them. Each corrected p is recomputed here from SQL: the sign test
(scipy), the mean test (a bootstrap-t written out in numpy), the difference test's rule (the larger of the
two where they agree in direction) and Holm by its definition."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import invoke
import pytest
from bootstrap_by_hand import bootstrap_p
from scipy.stats import binomtest

from kvbench.bench.leaderboard import synthetic_store
from support import holm_by_definition

POLICIES, TASKS, PROBLEMS = 3, 2, 30


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tasks, three policies, a null and a full cache; two samples per problem (scores 0, ½, 1: the
    bootstrap-t), policy-00 right on every sample of task-0 so that one test is strong."""
    database = tmp_path_factory.mktemp("families") / "store.duckdb"
    synthetic_store(database, policies=POLICIES, tasks=TASKS, problems=PROBLEMS, samples=2)
    with duckdb.connect(str(database)) as con:
        con.execute("UPDATE samples SET metric = 1, correct = true WHERE run_id = '00-policy-00'")
    return database


def raw_p(database: Path, policy: str, tasks: tuple[str, ...]) -> float:
    """The difference test's p for ``policy`` against the null, pooled over ``tasks``: per (task,
    problem) the mean of the samples' metric, paired in SQL in key order."""
    with duckdb.connect(str(database), read_only=True) as con:
        rows = con.execute(
            "WITH p AS (SELECT r.policy, s.task, s.problem_id, avg(s.metric) AS m FROM samples s "
            "JOIN runs r USING (run_id) WHERE list_contains(?, s.task) GROUP BY ALL) "
            "SELECT a.m - b.m FROM p a JOIN p b USING (task, problem_id) WHERE a.policy = ? "
            "AND b.policy = 'random' ORDER BY task, problem_id",
            [list(tasks), policy],
        ).fetchall()
    deltas = [d for (d,) in rows]
    wins, losses = sum(d > 0 for d in deltas), sum(d < 0 for d in deltas)
    sign = binomtest(wins, wins + losses).pvalue if wins + losses else 1.0
    mean = sum(deltas) / len(deltas)
    agree = (wins > losses and mean > 0) or (wins < losses and mean < 0)
    return max(sign, bootstrap_p(deltas)) if agree else 1.0


def compare_rows(database: Path, *args: str, cwd: Path) -> dict[tuple[str, str], dict]:
    done = invoke.kvbench("compare", "--db", str(database), "--format", "json", *args, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return {(row["task"], row["policy"]): row for row in json.loads(done.stdout)}


POLICY_NAMES = [f"policy-{i:02d}" for i in range(POLICIES)]
TASK_NAMES = [f"task-{t}" for t in range(TASKS)]


def test_a_table_family_is_the_policies_of_one_task(store: Path, tmp_path: Path) -> None:
    rows = compare_rows(store, cwd=tmp_path)
    for task in TASK_NAMES:
        expected = holm_by_definition([raw_p(store, p, (task,)) for p in POLICY_NAMES])
        for policy, p_holm in zip(POLICY_NAMES, expected, strict=True):
            row = rows[task, policy]
            assert row["p_holm"] == pytest.approx(p_holm, rel=1e-12)
            assert row["family_size"] == POLICIES
            assert row["family"] == f"the policies of the {task} table at K=256, against random"


def test_a_sweep_family_is_every_task_and_budget_together(store: Path, tmp_path: Path) -> None:
    rows = compare_rows(store, "--family", "sweep", cwd=tmp_path)
    keys = [(t, p) for t in TASK_NAMES for p in POLICY_NAMES]
    expected = holm_by_definition([raw_p(store, p, (t,)) for t, p in keys])
    for key, p_holm in zip(keys, expected, strict=True):
        assert rows[key]["p_holm"] == pytest.approx(p_holm, rel=1e-12), key
        assert rows[key]["family_size"] == len(keys)
        where = "synthetic · protect-prompt · hf/cpu/float32/sdpa seed 0"
        assert rows[key]["family"] == f"every task × budget table of {where} ({TASKS} tables)"
    # the sweep's correction is stronger than a table's: six tests instead of three
    table = compare_rows(store, cwd=tmp_path)
    assert rows["task-0", "policy-00"]["p_holm"] > table["task-0", "policy-00"]["p_holm"]
    # a filter chooses the rows shown, never the family: task-0 alone keeps the sweep's p-values
    alone = compare_rows(store, "--family", "sweep", "--task", "task-0", cwd=tmp_path)
    assert set(alone) == {("task-0", p) for p in POLICY_NAMES}
    for key, row in alone.items():
        assert (row["p_holm"], row["family_size"]) == (rows[key]["p_holm"], rows[key]["family_size"])


@pytest.mark.parametrize("family", ["table", "sweep"])
def test_pooled_rows_form_their_own_family(store: Path, tmp_path: Path, family: str) -> None:
    """With --pool the per-task rows keep the p-values they have without it (the pool adds nothing to
    their family), and the pooled rows are Holm-corrected among themselves only."""
    pooled = compare_rows(store, "--family", family, "--pool", f"both={','.join(TASK_NAMES)}", cwd=tmp_path)
    alone = compare_rows(store, "--family", family, cwd=tmp_path)
    for key, row in alone.items():
        assert (pooled[key]["p_holm"], pooled[key]["family_size"]) == (row["p_holm"], row["family_size"])
    expected = holm_by_definition([raw_p(store, p, tuple(TASK_NAMES)) for p in POLICY_NAMES])
    for policy, p_holm in zip(POLICY_NAMES, expected, strict=True):
        row = pooled["both", policy]
        assert row["p_holm"] == pytest.approx(p_holm, rel=1e-12)
        assert row["family_size"] == POLICIES
        assert "pooled" in row["family"] and row["family"] != alone["task-0", policy]["family"]


def test_the_terminal_table_names_each_family(store: Path, tmp_path: Path) -> None:
    done = invoke.kvbench("compare", "--db", str(store), "--family", "sweep", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert f"Holm over {TASKS * POLICIES} comparisons: every task × budget table of synthetic" in text


def test_the_leaderboard_states_its_families(store: Path) -> None:
    from kvbench.leaderboard import queries
    from kvbench.leaderboard.queries import Compression

    table = queries.leaderboard(store, "synthetic", "protect-prompt", Compression(4.0, None))
    assert table.families == [
        f"Holm over {POLICIES} comparisons: the policies of the pooled task-0 + task-1 table at N_avg/4, "
        "against random (a pooled table is a family apart: its per-task rows are not in it)",
        *(
            f"Holm over {POLICIES} comparisons: the policies of the {t} table at K=256, against random"
            for t in TASK_NAMES
        ),
    ]

"""Leaderboard queries on small synthetic stores of the runner's schema: the edge cases of real use."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd
import pytest

from kvbench.bench.leaderboard import synthetic_store
from kvbench.leaderboard import queries
from kvbench.leaderboard.curves import budget_curves
from kvbench.leaderboard.queries import Compression

AT_4X = Compression(4.0, None)


def store(tmp_path: Path) -> Path:
    database = tmp_path / "store.duckdb"
    synthetic_store(database, policies=3, tasks=2, problems=20, samples=2)
    return database


def test_a_policy_with_two_settings_is_two_arms_and_two_curves(tmp_path: Path) -> None:
    database = store(tmp_path)
    con = duckdb.connect(str(database))
    for task in ("00", "01"):
        old, new = f"{task}-policy-00", f"{task}-policy-00-w32"
        con.execute(
            "INSERT INTO runs SELECT * REPLACE (? AS run_id, '{\"window\": 32}' AS policy_params) FROM runs "
            "WHERE run_id = ?",
            [new, old],
        )
        con.execute(
            "INSERT INTO samples SELECT * REPLACE (? AS run_id, 1 - metric AS metric) FROM samples "
            "WHERE run_id = ?",
            [new, old],
        )
    con.close()
    table = queries.leaderboard(database, "synthetic", "protect-prompt", AT_4X).frame
    settings = table.loc[table["policy"] == "policy-00", "parameters"]
    assert sorted(settings) == ["window=32", "—"]
    curves = budget_curves(database, "synthetic", "protect-prompt")
    assert set(curves["policy"]) == {
        "policy-00 (defaults)",
        "policy-00 (window=32)",
        "policy-01",
        "policy-02",
        "random",
        "full",
    }
    one, other = (
        curves.loc[curves["policy"] == label, "score"].item()
        for label in ("policy-00 (defaults)", "policy-00 (window=32)")
    )
    assert one + other == 1.0  # each setting's own samples, not a mixture


def test_the_name_filter_never_changes_a_verdict(tmp_path: Path) -> None:
    database = store(tmp_path)
    every = queries.leaderboard(database, "synthetic", "protect-prompt", AT_4X).frame.set_index("policy")
    one = queries.leaderboard(database, "synthetic", "protect-prompt", AT_4X, name="POLICY-02").frame
    assert set(one["policy"]) == {"policy-02", "random", "full"}
    row = one.set_index("policy").loc["policy-02"]
    assert (
        row["p (Holm)"] == every.loc["policy-02", "p (Holm)"]
        and row["verdict"] == every.loc["policy-02", "verdict"]
    )


def test_the_average_covers_only_the_tasks_every_arm_ran(tmp_path: Path) -> None:
    database = store(tmp_path)
    con = duckdb.connect(str(database))
    con.execute("DELETE FROM samples WHERE run_id = '01-policy-01'")
    con.execute("DELETE FROM runs WHERE run_id = '01-policy-01'")
    con.close()
    table = queries.leaderboard(database, "synthetic", "protect-prompt", AT_4X)
    assert table.tasks == ["task-0", "task-1"] and table.average_over == ["task-0"]
    rows = table.frame.set_index("policy")
    assert rows.loc["policy-01", "task-1"] == "—"
    assert (
        rows.loc["policy-01", "average ± CI"].split(" ± ")[0]
        == rows.loc["policy-01", "task-0"].split(" ± ")[0]
    )


def test_a_database_without_benchmarks_has_an_empty_efficiency_view(tmp_path: Path) -> None:
    database = store(tmp_path)
    con = duckdb.connect(str(database))
    con.execute("DROP TABLE bench")  # as in a database written before bench rows were recorded
    con.close()
    scores = queries.leaderboard(database, "synthetic", "protect-prompt", AT_4X).frame
    assert queries.efficiency(database, "synthetic", scores).empty
    assert isinstance(queries.efficiency(database, "synthetic", pd.DataFrame()), pd.DataFrame)


def test_budget_curves_follow_the_quantity_and_pool_only_the_tasks_that_have_it(tmp_path: Path) -> None:
    database = store(tmp_path)
    con = duckdb.connect(str(database))
    # task-0 is a needle probe (its samples hold a survival), task-1 is not
    con.execute(
        "UPDATE samples SET needle_survival = (hash(problem_id, sample, run_id) % 1000) / 1000 "
        "WHERE task = 'task-0'"
    )
    expected = dict(
        con.execute(
            "SELECT r.policy, avg(per_problem) FROM (SELECT run_id, avg(needle_survival) AS per_problem "
            "FROM samples WHERE task = 'task-0' GROUP BY run_id, problem_id) JOIN runs r USING (run_id) "
            "GROUP BY r.policy"
        ).fetchall()
    )
    scores = dict(
        con.execute(
            "SELECT r.policy, avg(per_problem) FROM (SELECT run_id, avg(metric) AS per_problem "
            "FROM samples GROUP BY run_id, problem_id) JOIN runs r USING (run_id) GROUP BY r.policy"
        ).fetchall()
    )
    con.close()
    curves = budget_curves(database, "synthetic", "protect-prompt", quantity="needle-survival")
    got = dict(zip(curves["policy"], curves["score"], strict=True))
    assert got == pytest.approx(expected) and set(got) == {
        "policy-00",
        "policy-01",
        "policy-02",
        "random",
        "full",
    }
    assert set(curves["problems"]) == {20}  # task-0's problems only: task-1 has no survival to pool
    default = budget_curves(database, "synthetic", "protect-prompt")
    assert dict(zip(default["policy"], default["score"], strict=True)) == pytest.approx(scores)


def test_serve_benchmarks_land_in_the_efficiency_view_beside_decode_ones(tmp_path: Path) -> None:
    """A `kvbench bench serve --out` record, ingested, reads back with its adapter, concurrency and
    preemptions."""
    from kvbench.bench.serve import ServeTiming
    from kvbench.commands.bench import _record

    def timing(policy: str, speed: float, running: int, blocks: int) -> ServeTiming:
        return ServeTiming(
            policy=policy, requests=16, output_len=256, output_tokens_per_second=100.0 * speed,
            requests_per_second=0.4 * speed, peak_running=running, peak_blocks=blocks, pool_blocks=40,
            preemptions=0, tpot_ms=6.0, eviction_events=0 if policy == "full" else 512,
            select_ms_per_event=1.5, move_ms_per_event=0.5, eviction_share=0.1, speed_vs_full=speed,
            tpot_vs_full=1.0, concurrency_vs_full=running / 3, extra={"block_bytes": 65536},
        )  # fmt: skip

    runs = tmp_path / "runs"
    database = store(tmp_path)
    runs.mkdir()
    database.rename(runs / "kvbench.duckdb")
    settings = {"model": "synthetic", "adapter": "vllm", "budget": 96, "buffer": 8, "tokens": 256}
    rows = [timing("full", 1.0, 3, 36), timing("policy-00", 2.3, 9, 36)]
    _record(runs, settings, {"cpu": "test CPU"}, rows, kind="serve")
    database = runs / "kvbench.duckdb"
    scores = queries.leaderboard(database, "synthetic", "protect-prompt", AT_4X).frame
    view = queries.efficiency(database, "synthetic", scores)
    serve = view[view["benchmark"] == "serve"].set_index("policy")
    assert list(serve["adapter"]) == ["vllm", "vllm"]
    assert serve.loc["policy-00", "speed_vs_full"] == pytest.approx(2.3)
    assert serve.loc["policy-00", "peak_running"] == 9 and serve.loc["full", "peak_running"] == 3
    assert serve.loc["policy-00", "peak_kv_mib"] == pytest.approx(36 * 65536 / 2**20)
    assert serve.loc["policy-00", "ms_per_event"] == pytest.approx(2.0)
    assert (serve["preemptions"] == 0).all()
    assert serve.loc["policy-00", "average"] == pytest.approx(
        scores.set_index("policy").loc["policy-00", "average"]
    )


def test_problems_by_samples_counts_only_the_problems_the_ranked_quantity_scored() -> None:
    """An arm over two tasks, the ranked quantity present on one (two problems, one sample each) and
    missing on the other (two problems, two samples each, no score): one sample on each of 2 problems."""
    from kvbench.results.summary import CellSummary

    scored = CellSummary("a", scores={"p1": 1.0, "p2": 0.0}, truncated={"p1": 0.0, "p2": 0.0}, samples=2)
    missing = CellSummary("b", scores={}, truncated={"q1": 0.0, "q2": 0.0}, samples=4)
    assert queries.problems_by_samples([scored, missing]) == "2 × 1"  # the old label read "3 × 2"
    deeper = CellSummary("c", scores={"r1": 0.5}, truncated={"r1": 0.0}, samples=3)
    assert queries.problems_by_samples([scored, deeper]) == "3 × 1–3"


def test_benchmarks_stored_before_bench_serve_read_as_hf_decode_rows(tmp_path: Path) -> None:
    """A bench table written before `kvbench bench serve` existed has no kind, adapter or details: its
    rows are shown as what they were, hf decode benchmarks, the newest per policy."""
    database = store(tmp_path)
    with duckdb.connect(str(database)) as con:
        con.execute("DROP TABLE bench")
        con.execute(
            "CREATE TABLE bench (file VARCHAR, created DOUBLE, model VARCHAR, policy VARCHAR, "
            "budget INTEGER, buffer INTEGER, tokens INTEGER, tokens_per_second DOUBLE, speed_vs_full DOUBLE, "
            "peak_kv_bytes BIGINT, memory_vs_full DOUBLE, ms_per_event DOUBLE, machine JSON)"
        )
        row = "(?, ?, 'synthetic', ?, 512, 64, 4096, ?, 1.0, 1048576, 1.0, 0.5, '{\"cpu\": \"test\"}')"
        con.executemany(
            f"INSERT INTO bench VALUES {row}",
            [["a.json", 1.0, "full", 10.0], ["b.json", 2.0, "full", 12.0], ["b.json", 2.0, "policy-00", 9.0]],
        )
    scores = queries.leaderboard(database, "synthetic", "protect-prompt", AT_4X).frame
    view = queries.efficiency(database, "synthetic", scores).set_index("policy")
    assert set(view["benchmark"]) == {"decode"} and set(view["adapter"]) == {"hf"}
    assert view["tokens_per_second"].to_dict() == {"full": 12.0, "policy-00": 9.0}

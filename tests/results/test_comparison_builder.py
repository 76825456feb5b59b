"""The comparison builder on a hand-made store, every number it returns recomputed in SQL and scipy.

The store is a real DuckDB file with the runs and samples tables. Its arms cover each rule the builder
applies: a null and a full cache, three policies paired with the null (so Holm has a family of three),
one policy whose samples per problem differ from the null's (never paired), one that missed a task (left
out), an earlier smaller run of a policy (superseded), a task shown but not pooled, and runs of another
model and protocol (filtered out). Tasks have different numbers of problems, so an unweighted mean of
per-task rates differs from the per-sample rate the builder must report.
"""

from __future__ import annotations

import dataclasses
import json
import math

import duckdb
import numpy as np
import pytest
from bootstrap_by_hand import bootstrap_p
from scipy.stats import binomtest

from kvbench.bench.leaderboard import synthetic_spec
from kvbench.results.comparison import NO_BASELINE, common_tasks, compare_table, stored_runs
from kvbench.results.summary import summarize
from kvbench.store.ingest import SCHEMA
from support import holm_by_definition

PROBLEMS = {"t1": 22, "t2": 9, "t3": 3}
BUDGETS = {"t1": (50, 200.0), "t2": (30, 100.0), "t3": (20, 40.0)}  # (K, N_avg): K/N_avg 0.25 and 0.3
# run id -> (model, protocol, task, policy, role, samples per problem, chance of a correct sample, created)
RUNS = {
    "rand-1": ("m", "pp", "t1", "random", "policy", 2, 0.5, 0),
    "rand-2": ("m", "pp", "t2", "random", "policy", 2, 0.5, 0.5),
    "null-1": ("m", "pp", "t1", "random", "null", 2, 0.45, 1),
    "null-2": ("m", "pp", "t2", "random", "null", 2, 0.45, 2),
    "null-3": ("m", "pp", "t3", "random", "null", 2, 0.45, 3),
    "full-1": ("m", "pp", "t1", "full", "reference", 2, 0.9, 4),
    "full-2": ("m", "pp", "t2", "full", "reference", 2, 0.9, 5),
    "snap-old": ("m", "pp", "t1", "snapkv", "policy", 1, 0.1, 8),
    "snap-1": ("m", "pp", "t1", "snapkv", "policy", 2, 0.9, 9),
    "snap-2": ("m", "pp", "t2", "snapkv", "policy", 2, 0.9, 10),
    "tova-1": ("m", "pp", "t1", "tova", "policy", 2, 0.1, 11),
    "tova-2": ("m", "pp", "t2", "tova", "policy", 2, 0.1, 12),
    "h2o-1": ("m", "pp", "t1", "h2o", "policy", 2, 0.7, 13),
    "h2o-2": ("m", "pp", "t2", "h2o", "policy", 3, 0.7, 14),
    "stream-1": ("m", "pp", "t1", "streaming", "policy", 2, 0.6, 15),
    "other-model": ("m2", "pp", "t1", "snapkv", "policy", 2, 0.5, 16),
    "other-protocol": ("m", "kv", "t1", "snapkv", "policy", 2, 0.5, 17),
}
ARMS = {  # the runs the builder must choose for each arm on the pooled tasks
    ("random", "null"): ["null-1", "null-2"],
    ("full", "reference"): ["full-1", "full-2"],
    ("random", "policy"): ["rand-1", "rand-2"],
    ("snapkv", "policy"): ["snap-1", "snap-2"],
    ("tova", "policy"): ["tova-1", "tova-2"],
    ("h2o", "policy"): ["h2o-1", "h2o-2"],
}
PAIRED = [("random", "policy"), ("snapkv", "policy"), ("tova", "policy")]


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(tmp_path_factory.mktemp("builder") / "kvbench.duckdb"))
    con.execute(SCHEMA)
    rng = np.random.default_rng(2026)
    for run_id, (model, protocol, task, policy, role, samples, chance, created) in RUNS.items():
        budget, n_avg = BUDGETS[task]
        full = role == "reference"
        spec = synthetic_spec(
            model=model,
            task=task,
            protocol=protocol,
            policy=policy,
            samples=samples,
            budget=None if full else budget,
            n_avg=n_avg,
            ratio=None if full else 4.0,
            # the earlier, smaller run of snapkv has another identity: here, another problem limit
            limit=PROBLEMS[task] - 2 if run_id == "snap-old" else None,
        )
        con.execute(
            "INSERT INTO runs (run_id, model, task, protocol, adapter, device, dtype, attention, "
            "protocol_seed, samples_per_problem, budget, ratio, n_avg, policy, policy_params, role, created, "
            "spec) VALUES (?, ?, ?, ?, 'hf', 'cpu', 'float32', 'sdpa', 0, ?, ?, 4.0, ?, ?, '{}', ?, ?, ?)",
            [run_id, model, task, protocol, samples, budget, n_avg, policy, role, created, json.dumps(spec)],
        )
        problems = PROBLEMS[task] - (2 if run_id == "snap-old" else 0)
        for problem in range(problems):
            for sample in range(samples):
                correct = bool(rng.random() < chance)
                cut = bool(rng.random() < 0.3)
                con.execute(
                    "INSERT INTO samples (run_id, task, problem_id, sample, metric, correct, strict_correct, "
                    "finish_reason, no_answer, generated_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        run_id,
                        task,
                        f"p{problem}",
                        sample,
                        float(correct),
                        correct,
                        correct and not cut,
                        "length" if cut else "stop",
                        bool(not correct and rng.random() < 0.5),
                        int(rng.integers(10, 500)),
                    ],
                )
    return con


def table(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], object]:
    runs = stored_runs(con, model="m", protocol="pp")
    summaries = summarize(con, [r.run_id for r in runs])
    results = compare_table(runs, summaries, tasks=["t1", "t2"], also=["t3"])
    return {(r.policy, r.role): r for r in results}


def per_problem(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> str:
    return (
        "SELECT task, problem_id, avg(metric) AS m, avg(strict_correct::INTEGER) AS s FROM samples "
        f"WHERE run_id IN ({', '.join(repr(r) for r in run_ids)}) GROUP BY ALL"
    )


def sql_pairs(
    con: duckdb.DuckDBPyConnection, arm: list[str], other: list[str]
) -> tuple[float, int, int, int]:
    """Mean over shared (task, problem) of arm − other, with wins and losses, and the problems counted."""
    return con.execute(
        f"SELECT avg(a.m - b.m), count_if(a.m > b.m), count_if(a.m < b.m), count(*) "
        f"FROM ({per_problem(con, arm)}) a JOIN ({per_problem(con, other)}) b USING (task, problem_id)"
    ).fetchone()


def sql_deltas(con: duckdb.DuckDBPyConnection, arm: list[str], other: list[str]) -> list[float]:
    """arm − other per shared (task, problem), in the order of their keys."""
    rows = con.execute(
        f"SELECT a.m - b.m FROM ({per_problem(con, arm)}) a JOIN ({per_problem(con, other)}) b "
        "USING (task, problem_id) ORDER BY task, problem_id"
    ).fetchall()
    return [d for (d,) in rows]


def test_stored_runs_filters_and_orders(con: duckdb.DuckDBPyConnection) -> None:
    everything = stored_runs(con)
    assert [r.run_id for r in everything] == list(RUNS)
    assert {r.run_id for r in stored_runs(con, model="m2")} == {"other-model"}
    assert {r.run_id for r in stored_runs(con, protocol="kv")} == {"other-protocol"}
    assert [r.run_id for r in stored_runs(con, run_ids=["snap-2", "null-1", "absent"])] == [
        "null-1",
        "snap-2",
    ]
    assert stored_runs(con, run_ids=[]) == []
    first = everything[0]
    assert (first.runtime, first.seed, first.samples, first.budget, first.n_avg) == (
        "hf/cpu/float32/sdpa",
        0,
        2,
        50,
        200.0,
    )
    # streaming ran t1 only, so the tasks every arm ran are t1 alone; without it, t1 and t2
    mine = stored_runs(con, model="m", protocol="pp")
    assert common_tasks(mine) == ["t1"]
    assert common_tasks([r for r in mine if r.policy != "streaming"]) == ["t1", "t2"]


def test_arms_pool_the_chosen_runs_and_leave_out_incomplete_ones(con: duckdb.DuckDBPyConnection) -> None:
    arms = table(con)
    assert set(arms) == set(ARMS)  # streaming missed t2
    for key, run_ids in ARMS.items():
        arm = arms[key]
        assert [arm.runs[t].run_id for t in ("t1", "t2")] == run_ids  # snap-old is superseded
        score, strict = con.execute(f"SELECT avg(m), avg(s) FROM ({per_problem(con, run_ids)})").fetchone()
        assert arm.score.value == pytest.approx(score, abs=1e-12)
        assert arm.strict.value == pytest.approx(strict, abs=1e-12)
        assert arm.score.problems == arm.strict.problems == PROBLEMS["t1"] + PROBLEMS["t2"]
        cut, none, tokens, samples = con.execute(
            "SELECT avg((finish_reason = 'length')::INTEGER), avg(no_answer::INTEGER), "
            "avg(generated_tokens), count(*) FROM samples WHERE list_contains(?, run_id)",
            [run_ids],
        ).fetchone()
        assert arm.truncation_rate == pytest.approx(cut, abs=1e-12)
        assert arm.no_answer_rate == pytest.approx(none, abs=1e-12)
        assert arm.mean_generated_tokens == pytest.approx(tokens, abs=1e-12)
        assert arm.samples == samples
        for task, run_id in zip(("t1", "t2"), run_ids, strict=True):
            (alone,) = con.execute(f"SELECT avg(m) FROM ({per_problem(con, [run_id])})").fetchone()
            assert arm.per_task[task].value == pytest.approx(alone, abs=1e-12)
    # K/N_avg: the mean of each task's K / N_avg; the full cache has no budget to report
    for key in ARMS:
        expected = math.nan if key[1] == "reference" else (50 / 200 + 30 / 100) / 2
        assert arms[key].k_over_n_avg == pytest.approx(expected, nan_ok=True)
    # a task in ``also`` is shown for the arms that ran it, never pooled
    assert set(arms["random", "null"].runs) == set(arms["random", "null"].per_task) == {"t1", "t2", "t3"}
    assert set(arms["snapkv", "policy"].runs) == {"t1", "t2"}


def test_arms_are_paired_with_the_null_and_holm_corrected_together(con: duckdb.DuckDBPyConnection) -> None:
    arms = table(con)
    null, full = ARMS["random", "null"], ARMS["full", "reference"]
    sql = {key: sql_pairs(con, ARMS[key], null) for key in PAIRED}
    signs = [binomtest(wins, wins + losses, 0.5).pvalue for _, wins, losses, _ in sql.values()]
    # two samples per problem: scores in {0, ½, 1}, so the mean test is the studentized bootstrap's
    means = [bootstrap_p(sql_deltas(con, ARMS[key], null)) for key in PAIRED]
    # the difference test: sign test and mean test agreeing in direction, the larger p; Holm over those
    raw = [
        max(sign, mean) if (wins > losses) == (delta > 0) else 1.0
        for (delta, wins, losses, _), sign, mean in zip(sql.values(), signs, means, strict=True)
    ]
    for (key, (delta, wins, losses, shared)), p_sign, p_mean, p_holm in zip(
        sql.items(), signs, means, holm_by_definition(raw), strict=True
    ):
        test = arms[key].test
        assert (test.wins, test.losses, test.ties) == (wins, losses, shared - wins - losses)
        assert test.difference.value == pytest.approx(delta, abs=1e-12)
        assert arms[key].vs_baseline.value == pytest.approx(delta, abs=1e-12)
        assert test.p_value == pytest.approx(p_sign, rel=1e-12)
        assert test.p_mean == pytest.approx(p_mean, rel=1e-12)
        assert test.p_adjusted == pytest.approx(p_holm, rel=1e-12)
        assert test.family_size == len(PAIRED)
        expected = "inconclusive" if p_holm >= 0.05 else ("beats null" if wins > losses else "loses to null")
        assert arms[key].verdict == expected
    # the store was drawn so that both directions and an inconclusive test appear
    assert [arms[k].verdict for k in PAIRED] == ["inconclusive", "beats null", "loses to null"]
    assert len(set(raw)) == 3 and holm_by_definition(raw) != raw
    # the mean test is the larger p in at least one row: the sign test alone would not give these numbers
    assert any(m > s for s, m in zip(signs, means, strict=True))
    # the null is the baseline, not the random policy run made before it, and is not tested against itself
    assert arms["random", "null"].test is None and arms["random", "null"].vs_baseline is None
    assert arms["random", "null"].verdict is None
    # samples per problem differ on t2: shown, never paired
    h2o = arms["h2o", "policy"]
    assert (
        h2o.test is None and h2o.vs_baseline is None and h2o.verdict == NO_BASELINE == "no matching baseline"
    )
    # the full cache is compared with the null, without a test or a verdict
    reference = arms["full", "reference"]
    assert reference.test is None and reference.verdict is None
    assert reference.vs_baseline.value == pytest.approx(sql_pairs(con, full, null)[0], abs=1e-12)
    # every other arm against the full cache, under the same pairing rule as the null: h2o's samples per
    # problem differ from the full cache's on t2, so it is not paired with it either
    assert reference.vs_full is None and h2o.vs_full is None
    for key in ARMS.keys() - {("full", "reference"), ("h2o", "policy")}:
        assert arms[key].vs_full.value == pytest.approx(sql_pairs(con, ARMS[key], full)[0], abs=1e-12)


def test_a_table_without_its_null_pairs_nothing(con: duckdb.DuckDBPyConnection) -> None:
    runs = [r for r in stored_runs(con, model="m", protocol="pp") if r.policy != "random"]
    results = compare_table(runs, summarize(con, [r.run_id for r in runs]), tasks=["t1", "t2"])
    verdicts = {(r.policy, r.role): (r.verdict, r.vs_baseline) for r in results}
    assert verdicts == {
        ("full", "reference"): (None, None),
        ("snapkv", "policy"): (NO_BASELINE, None),
        ("tova", "policy"): (NO_BASELINE, None),
        ("h2o", "policy"): (NO_BASELINE, None),
    }
    # another baseline can be asked for: tova against snapkv
    results = compare_table(runs, summarize(con, [r.run_id for r in runs]), tasks=["t1"], baseline="snapkv")
    tova = next(r for r in results if r.policy == "tova")
    delta, wins, losses, _ = sql_pairs(con, ["tova-1"], ["snap-1"])
    assert (tova.test.wins, tova.test.losses) == (wins, losses)
    assert tova.vs_baseline.value == pytest.approx(delta, abs=1e-12)
    assert (
        json.dumps(sorted(r.policy for r in results if r.test is not None)) == '["h2o", "streaming", "tova"]'
    )
    # the full cache's reference run is never a baseline, even when its policy is asked for
    results = compare_table(runs, summarize(con, [r.run_id for r in runs]), tasks=["t1"], baseline="full")
    assert {r.policy: r.verdict for r in results if r.role == "policy"} == dict.fromkeys(
        ("snapkv", "tova", "h2o", "streaming"), NO_BASELINE
    )
    with pytest.raises(dataclasses.FrozenInstanceError):  # results are shared by three renderers
        results[0].samples = 0  # type: ignore[misc]

"""Metrics are pooled only when they are of one kind, and the page says what the command line says.

On the runner-written database (conftest.py): passkey (pass/fail: exact retrieval) beside fidelity
(a proportion: top-1 agreement) at 2x and 4x under two protocols, gsm8k beside gpqa-diamond (both
pass/fail) at a fixed K; and a one-task database. The page's default view is read as a visitor sees it
(the columns the grid shows), and each verdict is looked up in `kvbench compare`'s own JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from boardtest import mean, open_app, tab
from built import built_once
from invoke import kvbench

from kvbench.leaderboard.display import literal, parameters_text
from kvbench.leaderboard.queries import BADGES, Compression
from kvbench.results.comparison import compare_table, stored_runs
from kvbench.results.summary import summarize
from kvbench.store.ingest import reading

VERDICT = " verdict"


def _compare(database: Path, *args: str) -> list[dict]:
    done = kvbench("compare", "--db", str(database), "--format", "json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _shown(app) -> tuple[list[str], list[dict]]:
    """The main table as the grid shows it: its visible columns, and its rows."""
    (grid,) = tab(app, "Leaderboard").dataframe
    return list(grid.proto.column_order), grid.value.to_dict("records")


def _page_tables(database: Path, monkeypatch) -> list[tuple[str, Compression, list[str], list[dict]]]:
    """Every (protocol, compression) table of the page's default view, as shown."""
    app = open_app(database, monkeypatch)
    tables = []
    for index in range(len(app.sidebar.selectbox(key="protocol").options)):
        app.sidebar.selectbox(key="protocol").select_index(index).run()
        protocol = app.sidebar.selectbox(key="protocol").value
        for at in range(len(app.sidebar.selectbox(key="compression").options)):
            app.sidebar.selectbox(key="compression").select_index(at).run()
            assert not app.exception, app.exception
            columns, rows = _shown(app)
            tables.append((protocol, app.sidebar.selectbox(key="compression").value, columns, rows))
    return tables


@pytest.fixture(scope="session")
def mixed_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The issue's case on the tiny Qwen3: passkey (every arm retrieves nothing) beside fidelity, where
    streaming differs from the null by little on four problems. Pooled over both kinds, streaming would
    read *equivalent*; each task alone, it is *inconclusive*. planted-fact is pass/fail as passkey is."""

    def build(root: Path) -> Path:
        for task, limit in (("passkey", "6"), ("fidelity", "4"), ("planted-fact", "4")):
            run = (
                "run",
                "--model",
                "tiny-qwen3",
                "--task",
                task,
                "--policy",
                "snapkv",
                "--policy",
                "streaming",
            )
            done = kvbench(*run, "--limit", limit, "--samples", "1", "--quiet", cwd=root)
            assert done.returncode == 0, done.stdout + done.stderr
        return root / "runs" / "kvbench.snapshot.duckdb"

    return built_once(tmp_path_factory, "mixed-kinds", build)


def test_the_mixed_database_is_one_where_pooling_both_kinds_would_change_a_verdict(mixed_db: Path) -> None:
    """What makes the next test discriminating: the pool the page showed before would say otherwise."""
    with reading(mixed_db) as con:
        runs = stored_runs(con)
        summaries = summarize(con, [r.run_id for r in runs])
    pooled = {a.policy: a.test for a in compare_table(runs, summaries, tasks=("fidelity", "passkey"))}
    apart = {(r["task"], r["policy"]): r for r in _compare(mixed_db)}
    # pooled, passkey's pass/fail problems would be tested as a continuous metric; apart, exactly (the
    # verdict itself no longer differs: ten problems are too few for either kind to show equivalence)
    assert pooled["streaming"] is not None and pooled["streaming"].method == "bootstrap-t"
    assert apart[("passkey", "streaming")]["method"] == "exact"
    assert {apart[("passkey", "streaming")]["verdict"], apart[("fidelity", "streaming")]["verdict"]} == {
        "inconclusive"
    }


@pytest.mark.parametrize("database", ["mixed_db", "board_db", "one_ratio_db"])
def test_the_default_page_gives_kvbench_compare_verdicts_verdict_for_verdict(
    database: str, request: pytest.FixtureRequest, monkeypatch
) -> None:
    path: Path = request.getfixturevalue(database)
    cli = _compare(path)
    matched = 0
    for protocol, compression, columns, rows in _page_tables(path, monkeypatch):
        here = [r for r in cli if r["protocol"] == protocol and _at(r, compression)]
        verdicts = [c for c in columns if c == "verdict" or c.endswith(VERDICT)]
        assert verdicts, columns
        for row in rows:
            if row["role"] != "policy":
                continue
            for name in verdicts:
                # one task: the table's verdict is its task's; several: each task has its own column
                if name == "verdict":
                    (task,) = {r["task"] for r in here}
                else:
                    task = name[: -len(VERDICT)]
                (expected,) = [
                    r
                    for r in here
                    if r["task"] == task
                    and r["policy"] == row["policy"]
                    and parameters_text(r["params"]) == row["parameters"]
                ]
                assert row[name] == BADGES[expected["verdict"]], (protocol, compression, name, row["policy"])
                holm = "p (Holm)" if name == "verdict" else f"{task} p (Holm)"
                assert row[holm] == pytest.approx(expected["p_holm"], rel=1e-12)
                matched += 1
    # every row `kvbench compare` prints (one runtime and seed here) is on the page
    assert matched == len(cli) and matched >= 2


def _pools_caption(app) -> str:
    (caption,) = [c.value for c in tab(app, "Leaderboard").caption if "of the same kind" in c.value]
    return caption


def _at(row: dict, compression: Compression) -> bool:
    if compression.ratio is not None:
        return row["ratio"] == compression.ratio
    return row["ratio"] is None and row["budget"] == compression.budget


def _pooled_sql(
    database: Path, tasks: tuple[str, ...], budget: int, column: str = "metric"
) -> dict[str, float]:
    """Per policy: the mean over (task, problem) clusters of the problems' mean ``column``, from SQL."""
    con = duckdb.connect(str(database), read_only=True)
    try:
        rows = con.execute(
            f"SELECT r.policy, s.task, s.problem_id, avg(s.{column}) FROM samples s "
            "JOIN runs r USING (run_id) WHERE list_contains(?, s.task) AND r.budget = ? "
            "AND r.role <> 'reference' GROUP BY ALL",
            [list(tasks), budget],
        ).fetchall()
    finally:
        con.close()
    by_policy: dict[str, list[float]] = {}
    for policy, _, _, value in rows:
        by_policy.setdefault(policy, []).append(value)
    return {policy: mean(values) for policy, values in by_policy.items()}


def test_compare_refuses_a_pool_of_two_kinds_and_pools_one_kind(board_db: Path) -> None:
    mixed = kvbench("compare", "--db", str(board_db), "--pool", "probes=passkey,fidelity")
    assert mixed.returncode == 2 and "Traceback" not in mixed.stderr
    assert mixed.stderr.startswith(
        "kvbench: --pool probes=passkey,fidelity pools tasks whose metrics are of different kinds: "
        "passkey (pass/fail: exact), fidelity (proportion: top1_agreement)."
    ), mixed.stderr
    pooled = [r for r in _compare(board_db, "--pool", "graded=gsm8k,gpqa-diamond") if r["task"] == "graded"]
    expected = _pooled_sql(board_db, ("gsm8k", "gpqa-diamond"), 384)
    assert [r["policy"] for r in pooled] == ["snapkv"]
    assert pooled[0]["score"] == pytest.approx(expected["snapkv"]) and pooled[0]["problems"] == 4


def test_the_page_pools_tasks_of_one_kind_only_and_as_compare_pool_does(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch, url={"compression": "2x"})
    columns, rows = _shown(app)
    # passkey and fidelity: no average, no pooled verdict, and nothing to pool them with
    assert {"passkey verdict", "fidelity verdict"} <= set(columns)
    assert not {"verdict", "average ± CI", "Δ vs null"} & set(columns)
    assert not [t for t in app.toggle if t.key == "pooled"]
    app.toggle(key="wide").set_value(True).run()
    assert not [c for c in _shown(app)[0] if c.startswith("average") or c.startswith("pooled")]
    caption = _pools_caption(app)
    assert "passkey (pass/fail: exact)" in caption and "fidelity (proportion: top1_agreement)" in caption
    # gsm8k and gpqa-diamond, both pass/fail: each task's verdict by default, their pool on request
    app = open_app(board_db, monkeypatch, url={"compression": "K384"})
    columns, _ = _shown(app)
    assert {"gsm8k verdict", "gpqa-diamond verdict"} <= set(columns)
    assert not {"verdict", "average ± CI"} & set(columns)
    caption = _pools_caption(app)
    assert "*average* pools gpqa-diamond, gsm8k, as `kvbench compare --pool` does" in caption
    app.toggle(key="pooled").set_value(True).run()
    columns, rows = _shown(app)
    assert columns[:5] == ["policy", "verdict", "average ± CI", "Δ vs null", "p (Holm)"]
    (cli,) = [r for r in _compare(board_db, "--pool", "graded=gsm8k,gpqa-diamond") if r["task"] == "graded"]
    (snapkv,) = [r for r in rows if r["policy"] == "snapkv"]
    assert snapkv["verdict"] == BADGES[cli["verdict"]] and snapkv["p (Holm)"] == pytest.approx(cli["p_holm"])
    # the page names every Holm family behind its verdicts: each task's table, as compare names it, and
    # the pool's, a family apart
    (families,) = [c.value for c in tab(app, "Leaderboard").caption if c.value.startswith("Holm families:")]
    for row in [r for r in _compare(board_db, "--budget", "384") if r["family"]]:
        assert literal(f"Holm over {row['family_size']} comparison") in families
        assert literal(row["family"]) in families, (row["family"], families)
    assert literal("the policies of the pooled gpqa-diamond + gsm8k table") in families
    expected = _pooled_sql(board_db, ("gsm8k", "gpqa-diamond"), 384)
    assert float(snapkv["average ± CI"].split(" ± ")[0]) == pytest.approx(expected["snapkv"], abs=5e-4)


def test_a_pool_of_one_kind_beside_a_task_of_another_and_ranked_by_log_probability(
    mixed_db: Path, monkeypatch
) -> None:
    """passkey and planted-fact (pass/fail) are pooled, as `kvbench compare --pool` pools them, while
    fidelity keeps its own verdict; ranked by the answer's log-probability every task is one quantity."""
    app = open_app(mixed_db, monkeypatch)
    app.toggle(key="pooled").set_value(True).run()
    columns, rows = _shown(app)
    pooled = "pooled pass/fail"
    assert columns[:4] == ["policy", f"{pooled} verdict", "fidelity verdict", pooled]
    needles = ("passkey", "planted-fact")
    for quantity in ("score", "answer-logprob"):
        cli = {
            r["policy"]: r
            for r in _compare(mixed_db, "--pool", "needles=passkey,planted-fact", "--metric", quantity)
            if r["task"] == "needles"
        }
        column = "metric" if quantity == "score" else "answer_logprob"
        expected = _pooled_sql(mixed_db, needles, 256, column)
        prefix = f"{pooled} " if quantity == "score" else ""  # one quantity: every task pools
        shown = {r["policy"]: r for r in rows}
        for policy in ("snapkv", "streaming"):
            assert shown[policy][f"{prefix}verdict"] == BADGES[cli[policy]["verdict"]], (quantity, policy)
            assert shown[policy][f"{prefix}p (Holm)"] == pytest.approx(cli[policy]["p_holm"], rel=1e-12)
            score = shown[policy][pooled if prefix else "average ± CI"]
            assert float(score.split(" ± ")[0]) == pytest.approx(expected[policy], abs=5e-4), quantity
            assert cli[policy]["score"] == pytest.approx(expected[policy], rel=1e-9), quantity
        app.sidebar.selectbox(key="quantity").set_value("answer-logprob").run()
        columns, rows = _shown(app)
    assert columns[:5] == ["policy", "verdict", "average ± CI", "Δ vs null", "p (Holm)"]
    assert len({round(float(r["average ± CI"].split(" ± ")[0]), 3) for r in rows}) == 4  # four arms differ


def test_head_to_head_pools_only_tasks_of_one_kind(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch, url={"pair_a": "snapkv", "pair_b": "random (null)"})
    rows = tab(app, "Head-to-head").dataframe[0].value.set_index("task")
    assert set(rows.index) == {"passkey", "fidelity"}  # no mean of exact retrieval and agreement
    assert rows.loc["passkey", "kind"] == "pass/fail: exact"
    assert rows.loc["fidelity", "kind"] == "proportion: top1_agreement"

"""The leaderboard in Streamlit's AppTest, on a database the real runner wrote (see conftest.py).

Expected values are computed here independently, with plain SQL over the samples table.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from boardtest import APP, all_text, by_policy, chart_traces, frame, mean, open_app, sql_scores, tab
from streamlit.testing.v1 import AppTest

from kvbench.leaderboard import queries
from kvbench.leaderboard.app import DATABASE_ENV
from kvbench.leaderboard.queries import Compression

INJECTION = "' OR 1=1 --"


def test_the_table_has_every_arm_with_values_from_the_samples(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch)
    assert app.sidebar.selectbox(key="compression").value == Compression(2.0, None)
    table = by_policy(app)
    assert set(table) == {"full", "random", "streaming", "snapkv"}
    assert {table[p]["role"] for p in table} == {"reference", "null", "policy"}
    expected = sql_scores(board_db, 2.0)
    for policy, row in table.items():
        for task in ("passkey", "fidelity"):
            assert float(row[task].split(" ± ")[0]) == pytest.approx(
                mean(expected[policy][task].values()), abs=5e-4
            )
    badges = ("beats null", "equivalent", "inconclusive", "loses")
    for task in ("passkey", "fidelity"):  # each task paired and tested on its own problems
        null, snap = expected["random"][task], expected["snapkv"][task]
        assert table["snapkv"][f"{task} Δ vs null"] == pytest.approx(mean(snap[k] - null[k] for k in null))
        wins, ties, losses = (int(x) for x in table["snapkv"][f"{task} W/T/L"].split("/"))
        assert (wins, losses) == (sum(snap[k] > null[k] for k in null), sum(snap[k] < null[k] for k in null))
        assert wins + ties + losses == 3 and table["snapkv"][f"{task} verdict"] in badges
        assert table["random"][f"{task} verdict"] == "null"
    assert table["snapkv"]["K/N_avg"] == pytest.approx(0.5)
    assert "Against the null:" in app.markdown[0].value and ":gray-badge[" in app.markdown[0].value


def test_filters_change_the_table(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch)
    at_2x = by_policy(app)
    app.sidebar.selectbox(key="compression").set_value(Compression(4.0, None)).run()
    at_4x = by_policy(app)
    assert at_4x["snapkv"]["K/N_avg"] == pytest.approx(0.25)
    assert at_4x["snapkv"]["fidelity"] != at_2x["snapkv"]["fidelity"]
    assert at_4x["full"]["fidelity"] == at_2x["full"]["fidelity"]
    app.sidebar.text_input(key="name").set_value("snap").run()
    assert set(by_policy(app)) == {"snapkv", "random", "full"}
    app.sidebar.selectbox(key="compression").set_value(Compression(None, 384)).run()
    fixed = by_policy(app)
    assert {"gsm8k", "gpqa-diamond"} <= set(fixed["snapkv"]) and "passkey" not in fixed["snapkv"]
    expected = sql_scores(board_db, None, 384)
    assert float(fixed["snapkv"]["gsm8k"].split(" ± ")[0]) == pytest.approx(
        mean(expected["snapkv"]["gsm8k"].values()), abs=5e-4
    )


def test_sql_in_a_filter_only_empties_the_selection(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch)
    before = by_policy(app)
    app.sidebar.text_input(key="name").set_value(INJECTION).run()
    assert not app.exception
    after = by_policy(app)
    assert set(after) == {"random", "full"}  # no policy's name contains the text; the baselines stay
    assert after["random"]["passkey"] == before["random"]["passkey"]
    assert any("No policy matches" in info.value for info in app.info)
    for model in (INJECTION, "tiny-qwen3"):
        table = queries.leaderboard(board_db, model, INJECTION, Compression(2.0, None))
        assert table.frame.empty and table.run_ids == []
    assert queries.choices(board_db, INJECTION).protocols == []
    assert queries.problems(board_db, INJECTION).frame.empty


def test_budget_curves_carry_every_policy_the_null_band_and_full(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch)
    # passkey (pass/fail) and fidelity (a proportion) are never pooled: one task at a time
    assert app.selectbox(key="curve_task").options == ["fidelity", "passkey"]
    traces = chart_traces(app, "Budget curves")
    assert set(traces) == {
        "Random Attention (null) 95% CI",
        "random (null)",
        "snapkv",
        "streaming",
        "full cache",
    }
    assert (
        traces["snapkv"]["x"] == [2.0, 4.0] and traces["Random Attention (null) 95% CI"]["fill"] == "toself"
    )
    for ratio, y in zip((2.0, 4.0), traces["snapkv"]["y"], strict=True):
        expected = sql_scores(board_db, ratio)["snapkv"]
        assert y == pytest.approx(mean(expected["fidelity"].values()))
    full = sql_scores(board_db, 2.0)["full"]
    assert traces["full cache"]["y"][0] == pytest.approx(mean(full["fidelity"].values()))
    app.selectbox(key="curve_task").set_value("passkey").run()
    traces = chart_traces(app, "Budget curves")
    assert traces["snapkv"]["y"][0] == pytest.approx(
        mean(sql_scores(board_db, 2.0)["snapkv"]["passkey"].values())
    )


def test_efficiency_shows_the_recorded_decode_benchmark(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch, url={"compression": "K384"})  # gsm8k and gpqa: one average
    rows = next(f.value for f in tab(app, "Efficiency").dataframe if "speed_vs_full" in f.value)
    mixed = {"full @ mixed-4bit-g8", "random @ mixed-4bit-g8"}  # the same caches at 4 bits
    assert set(rows["policy"]) == {"full", "random", "snapkv", *mixed}
    scatter = chart_traces(app, "Efficiency")["policies"]
    assert sorted(scatter["text"]) == sorted(["full", "random", "snapkv", *mixed])
    assert sorted(scatter["x"]) == sorted(rows["speed_vs_full"])


def test_efficiency_shows_what_eviction_cost_in_the_tables_runs(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch)  # K = N_avg / 2 on passkey and fidelity
    cost = frame(app, "Efficiency").set_index("policy")
    with duckdb.connect(str(board_db), read_only=True) as con:
        found = con.execute(
            "SELECT r.policy, sum(s.eviction_seconds), sum(s.evictions) FROM samples s JOIN runs r "
            "USING (run_id) WHERE r.model = 'tiny-qwen3' AND r.ratio = 2 AND r.protocol = 'protect-prompt' "
            "GROUP BY ALL HAVING sum(s.evictions) > 0"
        ).fetchall()
    expected = {policy: 1000 * seconds / events for policy, seconds, events in found}
    assert set(cost.index) == set(expected) == {"random", "streaming", "snapkv"}
    for policy, ms in expected.items():
        assert cost.loc[policy, "ms_per_event"] == pytest.approx(ms)
        assert cost.loc[policy, "× null"] == pytest.approx(ms / expected["random"])


def test_policy_page_drills_down_to_outputs_but_never_private_text(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch)
    app.selectbox(key="policy").set_value("snapkv").run()
    assert any("SnapKV" in t.value for t in app.text)  # its stored documentation, as plain text
    runs = frame(app, "Policy")
    assert {"passkey", "fidelity", "gsm8k", "gpqa-diamond"} <= set(runs["task"])
    drill = app.selectbox(key="drill")
    public = next(o for o in drill.options if "/ gsm8k /" in o)
    drill.set_value(public).run()
    rows = frame(app, "Policy", 1)
    assert rows["output"].notna().all() and len(rows) == 2
    private = next(o for o in app.selectbox(key="drill").options if "/ gpqa-diamond /" in o)
    app.selectbox(key="drill").set_value(private).run()
    rows = frame(app, "Policy", 1)
    assert "output" not in rows.columns and len(rows) == 2 and rows["problem_id"].str.len().gt(0).all()
    stored = queries.policy_runs(board_db, "snapkv")
    private_run = stored.loc[stored["task"] == "gpqa-diamond", "run_id"].iloc[0]
    assert queries.problems(board_db, private_run).frame["output"].isna().all()
    shown = " ".join(all_text(app))
    assert "PRIVATE-" not in shown  # every text of the private fixture carries this marker


def test_provenance_names_every_run_behind_the_table(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch)
    runs = frame(app, "Provenance")
    assert len(runs) == 4 * 2 and runs["run_id"].is_unique  # four arms × two tasks at 2x
    # what differs per run in its table; what every run shares once below it, so that both fit a screen
    shared = dict(frame(app, "Provenance", 1).itertuples(index=False))
    assert {"spec_sha256", "created"} <= set(runs) and {"kvbench_version", "git_sha", "cpu"} <= set(shared)
    for column in ("spec_sha256", "kvbench_version", "git_sha", "torch", "cpu", "created"):
        if column in runs:
            assert runs[column].notna().all() and runs[column].nunique() > 1, column
        else:
            assert shared[column] not in ("—", "None", "nan") and column not in runs, column
    con = duckdb.connect(str(board_db), read_only=True)
    (versions,) = con.execute(
        "SELECT list(DISTINCT kvbench_version) FROM runs WHERE list_contains(?, run_id)",
        [list(runs["run_id"])],
    ).fetchone()
    con.close()
    assert versions == [shared["kvbench_version"]]


def test_a_missing_or_empty_database_gets_a_friendly_page(tmp_path: Path, monkeypatch) -> None:
    app = open_app(tmp_path / "nothing.duckdb", monkeypatch)
    assert "No results" in app.info[0].value and "kvbench run" in app.markdown[0].value
    empty = tmp_path / "empty.duckdb"
    duckdb.connect(str(empty)).close()
    assert "No results" in open_app(empty, monkeypatch).info[0].value


@pytest.mark.parametrize(
    "policies,problems,rows", [(1, 10, 3 * 4 * 40), (50, 2, 52 * 4 * 8), (50, 125, 104_000)]
)
def test_the_app_renders_small_and_large_stores(
    tmp_path: Path, monkeypatch, policies, problems, rows
) -> None:
    from kvbench.bench.leaderboard import synthetic_store

    database = tmp_path / "store.duckdb"
    assert synthetic_store(database, policies=policies, problems=problems) == rows
    monkeypatch.setenv(DATABASE_ENV, str(database))
    app = AppTest.from_file(APP, default_timeout=120).run()
    assert not app.exception
    assert len(frame(app, "Leaderboard")) == policies + 2


def test_the_app_reads_the_snapshot_while_a_run_writes(board_db: Path, tmp_path: Path, monkeypatch) -> None:
    import shutil
    import subprocess
    import sys

    runs = tmp_path / "runs"
    shutil.copytree(board_db.parent, runs, ignore=shutil.ignore_patterns(".ingest.lock"))
    app = open_app(runs / "kvbench.snapshot.duckdb", monkeypatch)
    writer = duckdb.connect(str(runs / "kvbench.duckdb"))  # a writer holding the database, as ingest does
    try:
        app.run()
        assert not app.exception and "h2o" not in by_policy(app)
    finally:
        writer.close()
    kvbench = str(Path(sys.executable).parent / "kvbench")
    suite = board_db.parents[1] / "sweep.yaml"
    run = subprocess.run(
        [kvbench, "run", "--suite", str(suite), "--policy", "h2o", "--quiet"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    app.run()  # the newly published snapshot is read afresh
    assert "h2o" in by_policy(app)


def test_empty_cells_show_a_dash_and_parameters_read_as_key_value(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch)
    app.selectbox(key="policy").set_value("snapkv").run()
    for table in app.dataframe:
        assert table.proto.placeholder == "—"  # what Streamlit prints for a missing value
    con = duckdb.connect(str(board_db), read_only=True)
    (stored,) = con.execute("SELECT DISTINCT policy_params FROM runs WHERE policy = 'snapkv'").fetchone()
    con.close()
    expected = ", ".join(f"{k}={v}" for k, v in json.loads(stored).items())
    assert expected.startswith("window=64")
    rows = by_policy(app)
    assert rows["snapkv"]["parameters"] == expected and rows["random"]["parameters"] == "—"
    assert rows["full"]["passkey W/T/L"] == "—" and rows["full"]["passkey verdict"] == "reference"
    assert set(frame(app, "Policy")["parameters"]) == {expected}
    assert any(expected in option for option in app.selectbox(key="drill").options)
    shown = list(all_text(app))
    assert not any(text in ("None", "{}", "nan") or text.startswith('{"') for text in shown)

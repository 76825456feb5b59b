"""The Analysis view draws the stored value analysis: the figures' numbers are the table's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
from boardtest import _decoded, open_app, tab

from kvbench.leaderboard.analysis import value_analyses


def test_the_analysis_view_draws_the_stored_correlations(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch)
    view = tab(app, "Analysis")
    (choice,) = view.selectbox
    assert choice.value.startswith("tiny-qwen3 · fidelity · 1 traces")
    charts = [json.loads(c.proto.spec) for c in view.get("plotly_chart")]
    assert len(charts) == 3
    with duckdb.connect(str(board_db), read_only=True) as con:
        stored = dict(
            con.execute(
                "SELECT layer, value FROM value_analysis WHERE statistic = 'pearson_range_v_error_4bit'"
            ).fetchall()
        )
    bars = [dict(zip(_decoded(t["x"]), _decoded(t["y"]), strict=True)) for t in charts[0]["data"]]
    names = [(t["name"], t["legendgroup"]) for t in charts[0]["data"]]
    assert len(bars) == 6  # 2, 4 and 8 bits, Pearson and Spearman
    assert [n for n, bar in zip(names, bars, strict=True) if bar == stored] == [("4-bit", "4-bit")]


def test_without_an_analysis_the_view_says_how_to_make_one(
    board_db: Path, tmp_path: Path, monkeypatch
) -> None:
    bare = tmp_path / "bare.duckdb"
    shutil.copyfile(board_db, bare)
    with duckdb.connect(str(bare)) as con:
        con.execute("DROP TABLE value_analysis")
    assert value_analyses(bare).empty
    app = open_app(bare, monkeypatch)
    (message,) = tab(app, "Analysis").info
    assert "kvbench analyze values" in message.value

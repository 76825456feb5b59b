"""Helpers the leaderboard's tests share: opening the app, reading its tables and charts, and the
expected values straight from SQL over the samples table."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

import kvbench.leaderboard
from kvbench.leaderboard.app import DATABASE_ENV
from kvbench.leaderboard.public import PUBLIC_ENV

APP = str(Path(kvbench.leaderboard.__file__).with_name("app.py"))


def open_app(
    database: Path, monkeypatch: pytest.MonkeyPatch, *, public: bool = False, url: dict | None = None
) -> AppTest:
    """The app on ``database`` after its first run, in public mode or not, opened at ``url``'s query."""
    monkeypatch.setenv(DATABASE_ENV, str(database))
    monkeypatch.setenv(PUBLIC_ENV, "1" if public else "")
    app = AppTest.from_file(APP, default_timeout=120)
    for key, value in (url or {}).items():
        app.query_params[key] = value
    app.run()
    assert not app.exception, app.exception
    return app


def tab(app: AppTest, label: str):
    (view,) = [t for t in app.tabs if t.label == label]
    return view


def frame(app: AppTest, label: str, index: int = 0):
    """The index-th table shown in one of the app's tabs."""
    return tab(app, label).dataframe[index].value


def _decoded(value):
    """Plotly writes numeric arrays as base64 typed arrays ({dtype, bdata}), also inside attributes such
    as error_x; lists stay lists."""
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).tolist()
    if isinstance(value, dict):
        return {k: _decoded(v) for k, v in value.items()}
    return value


def chart_traces(app: AppTest, label: str) -> dict[str, dict]:
    """The traces, by name, of the one plotly chart in a tab, arrays decoded."""
    (chart,) = tab(app, label).get("plotly_chart")
    traces = json.loads(chart.proto.spec)["data"]
    return {t["name"]: {k: _decoded(v) for k, v in t.items()} for t in traces}


def by_policy(app: AppTest) -> dict[str, dict]:
    return {row["policy"]: row for row in frame(app, "Leaderboard").to_dict("records")}


def sql_scores(
    database: Path, ratio: float | None, budget: int | None = None, protocol: str = "protect-prompt"
) -> dict[str, dict]:
    """Per policy and task: problem -> the mean of its samples' metric under ``protocol``, straight from
    SQL."""
    con = duckdb.connect(str(database), read_only=True)
    try:
        rows = con.execute(
            "SELECT r.policy, s.task, s.problem_id, avg(s.metric) FROM samples s JOIN runs r USING (run_id) "
            "WHERE r.model = 'tiny-qwen3' AND r.protocol = ? "
            "AND (r.role = 'reference' OR r.ratio = ? OR (? IS NULL AND r.budget = ?)) GROUP BY ALL",
            [protocol, ratio, ratio, budget],
        ).fetchall()
    finally:
        con.close()
    scores: dict[str, dict] = {}
    for policy, task, problem, value in rows:
        scores.setdefault(policy, {}).setdefault(task, {})[problem] = value
    return scores


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def all_text(app: AppTest) -> Iterator[str]:
    """Every value the page shows: texts, widget labels and options, and every cell of every table."""
    for kind in ("markdown", "caption", "info", "subheader", "title", "text"):
        for element in getattr(app, kind):
            yield str(element.value)
    for widget in (*app.selectbox, *app.text_input):
        yield str(widget.label)
        yield from (str(o) for o in getattr(widget, "options", []))
    for element in app.dataframe:
        yield from (str(c) for c in element.value.columns)
        # a missing value is drawn as the table's placeholder, which each test checks on its own
        yield from (str(v) for v in element.value.to_numpy().ravel() if not pd.isna(v))

"""The Retention view: what each policy's caches kept at their last eviction event, below the null's.

Every figure is read from the samples of the leaderboard table's runs (protocol.md, "Retention
telemetry"): per-layer prompt survival and cross-head coverage, survival by age, and for the needle probes
recall against the eviction events a fact lived through before its question.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from kvbench.leaderboard.display import MISSING
from kvbench.leaderboard.queries import Table
from kvbench.specs.resolved import Role
from kvbench.store.board_tables import counted_runs
from kvbench.store.ingest import reading

FIGURES = {
    "head_coverage": ("cross-head coverage", "layer", "|∪ kept| / (Hkv · (K − B))"),
    "prompt_held_any": ("prompt held by at least one KV head", "layer", "share of the prompt"),
    "prompt_held_all": ("prompt held by every KV head", "layer", "share of the prompt"),
    "kept_by_age": ("survival by age", "age bucket (0 = oldest tenth of the sequence)", "kept share"),
}
"""The list columns: their title, what their index means and what their value means."""
RECALL = ("recall against eviction events", "eviction events between the fact and its question", "recall")
SUMMARY = {
    "head_coverage": "coverage",
    "prompt_held_any": "prompt held (any head)",
    "prompt_held_all": "prompt held (every head)",
    "kept_by_age": "kept (newest tenth)",
}
"""The table's columns: each list averaged (survival by age: its newest bucket)."""

_LISTS = " UNION ALL ".join(
    f"SELECT s.run_id, s.problem_id, s.sample, '{name}' AS figure, "
    f"generate_subscripts(s.{name}, 1) - 1 AS x, unnest(s.{name}) AS value FROM samples s "
    f"WHERE list_contains($runs, s.run_id) AND s.{name} IS NOT NULL"
    for name in FIGURES
)


def retention_figures(database: Path, run_ids: list[str]) -> pd.DataFrame:
    """Per policy (its role beside it), figure and x: the mean over the runs' samples, and how many.

    ``figure`` is a list column of the samples (x its index) or ``recall`` (x the needle's events)."""
    with reading(database) as con:
        return con.execute(
            f"""
            WITH points AS (
                {_LISTS}
                UNION ALL
                SELECT run_id, problem_id, sample, 'recall', needle_events, correct::INTEGER::DOUBLE
                FROM samples WHERE list_contains($runs, run_id) AND needle_events IS NOT NULL
                    AND correct IS NOT NULL
            )
            SELECT r.policy, r.role, p.figure, p.x, avg(p.value) AS value, count(*) AS samples
            FROM points p JOIN {counted_runs(con)} r USING (run_id)
            WHERE NOT isnan(p.value)
            GROUP BY ALL ORDER BY r.policy, p.figure, p.x
            """,
            {"runs": list(run_ids)},
        ).df()


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per policy, each figure reduced to one number: the null's row first, to read each policy's
    against it, then the policies, then the full cache."""
    table = []
    for (policy, role), part in rows.groupby(["policy", "role"], sort=True):
        row: dict[str, object] = {"policy": _label(policy, role), "role": role}
        for figure, column in SUMMARY.items():
            values = part[part["figure"] == figure]
            if figure == "kept_by_age":
                values = values[values["x"] == values["x"].max()]
            row[column] = values["value"].mean() if not values.empty else None
        table.append(row)
    frame = pd.DataFrame(table, columns=["policy", "role", *SUMMARY.values()])
    first = {Role.NULL: 0, Role.POLICY: 1, Role.REFERENCE: 2}
    frame = frame.sort_values("role", key=lambda r: r.map(first), kind="stable")
    return frame[["policy", *SUMMARY.values()]].reset_index(drop=True)


def figure(rows: pd.DataFrame, name: str, title: str, x_title: str, y_title: str) -> go.Figure:
    """One line per policy over ``x``; the null dashed in gray."""
    drawn = go.Figure()
    for (policy, role), part in rows[rows["figure"] == name].groupby(["policy", "role"], sort=True):
        null = role == Role.NULL
        drawn.add_trace(
            go.Scatter(
                x=part["x"],
                y=part["value"],
                mode="lines+markers",
                name=_label(policy, role),
                line={"dash": "dot", "color": "gray"} if null else None,
            )
        )
    drawn.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title)
    return drawn


def _label(policy: str, role: str) -> str:
    return f"{policy} (null)" if role == Role.NULL else policy


def retention_view(query, table: Table) -> None:
    rows = query("retention_figures", table.run_ids)
    if rows.empty:
        st.info(
            "No retention telemetry in these runs: samples stored before schema 9, or no eviction event "
            "(the full cache, or traces shorter than K + B)."
        )
        return
    numbers = {c: st.column_config.NumberColumn(format="%.3f") for c in SUMMARY.values()}
    st.dataframe(
        summary(rows), hide_index=True, placeholder=MISSING, key="retention_table", column_config=numbers
    )
    st.caption(
        "After each sample's last eviction event, averaged over layers and over the samples of every task "
        "in the table, the null's row first; kept (newest tenth): the kept share of the newest tenth of the "
        "candidates."
    )
    for name, (title, x_title, y_title) in FIGURES.items():
        if (rows["figure"] == name).any():
            st.plotly_chart(figure(rows, name, title, x_title, y_title), key=f"retention_{name}")
    if (rows["figure"] == "recall").any():
        st.plotly_chart(figure(rows, "recall", *RECALL), key="retention_recall")
        st.caption("Needle probes (e.g. the needle-distance task): exact recall by the eviction events the "
                   "fact lived through as a candidate before its question.")  # fmt: skip

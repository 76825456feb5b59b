"""Plotly figures of the leaderboard: budget curves and the efficiency scatter."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvbench.leaderboard.display import chart_text
from kvbench.specs.resolved import Role

NULL_BAND = "Random Attention (null) 95% CI"


def _bars(rows: pd.DataFrame, value: str) -> dict:
    """Error bars from each row's ``value`` to its interval's ends (the ``low`` and ``high`` columns)."""
    return {"type": "data", "array": rows["high"] - rows[value], "arrayminus": rows[value] - rows["low"]}


def budget_curves(curves: pd.DataFrame, title: str, quantity: str = "score") -> go.Figure:
    """One line per policy over the compression ratio, the null as a shaded band, full cache as a line."""
    swept = curves[curves["ratio"].notna()].sort_values("ratio")
    if swept["ratio"].nunique() == 1:
        return _one_ratio(curves, title, quantity)
    figure = go.Figure()
    null = swept[swept["role"] == Role.NULL]
    if not null.empty:
        figure.add_trace(
            go.Scatter(
                x=list(null["ratio"]) + list(null["ratio"])[::-1],
                y=list(null["high"]) + list(null["low"])[::-1],
                fill="toself",
                fillcolor="rgba(120,120,120,0.25)",
                line={"width": 0},
                name=NULL_BAND,
                hoverinfo="skip",
            )
        )
    for policy, rows in swept.groupby("policy", sort=True):
        is_null = rows["role"].iloc[0] == Role.NULL
        figure.add_trace(
            go.Scatter(
                x=rows["ratio"],
                y=rows["score"],
                mode="lines+markers",
                name=chart_text(f"{policy} (null)" if is_null else policy),
                line={"dash": "dot", "color": "gray"} if is_null else None,
                error_y=_bars(rows, "score"),
            )
        )
    full = curves[curves["role"] == Role.REFERENCE]
    if not full.empty:
        span = [swept["ratio"].min(), swept["ratio"].max()] if not swept.empty else [2, 16]
        score = float(full["score"].iloc[0])
        figure.add_trace(
            go.Scatter(
                x=span,
                y=[score, score],
                mode="lines",
                name="full cache",
                line={"dash": "dash", "color": "black"},
            )
        )
    # a title names the model and the task, which a bundle may name (as the arms' labels, their parameters)
    figure.update_layout(
        title=chart_text(title), xaxis_title="compression ratio (N_avg / K)", yaxis_title=quantity
    )
    figure.update_xaxes(type="log", tickvals=[2, 4, 8, 16], ticktext=["2x", "4x", "8x", "16x"])
    return figure


def _one_ratio(curves: pd.DataFrame, title: str, quantity: str) -> go.Figure:
    """One ratio has no curve: each arm is a point with its interval, the null's interval a band across
    them and the full cache a line, so both stay visible."""
    swept = curves[curves["ratio"].notna()]
    ratio = float(swept["ratio"].iloc[0])
    figure = go.Figure(
        go.Scatter(
            x=swept["policy"],
            y=swept["score"],
            mode="markers",
            name=f"at {ratio:g}x (95% CI)",
            marker={"size": 10},
            error_y=_bars(swept, "score"),
        )
    )
    null = swept[swept["role"] == Role.NULL]
    if not null.empty:
        low, high = float(null["low"].iloc[0]), float(null["high"].iloc[0])
        figure.add_hrect(
            y0=low, y1=high, fillcolor="rgba(120,120,120,0.25)", line_width=0, name=NULL_BAND, showlegend=True
        )
    full = curves[curves["role"] == Role.REFERENCE]
    if not full.empty:
        score = float(full["score"].iloc[0])
        figure.add_hline(y=score, line={"dash": "dash", "color": "black"}, name="full cache", showlegend=True)
    figure.update_layout(
        title=chart_text(f"{title} (one ratio: {ratio:g}x)"), xaxis_title="policy", yaxis_title=quantity
    )
    return figure


def efficiency(rows: pd.DataFrame, title: str) -> go.Figure:
    """Decode speed relative to the full cache against the average score, one point per policy."""
    figure = go.Figure(
        go.Scatter(
            x=rows["speed_vs_full"],
            y=rows["average"],
            mode="markers+text",
            text=rows["policy"],
            textposition="top center",
            marker={"size": 8 + 24 * (1 - rows["memory_vs_full"].clip(0, 1))},
            name="policies",
        )
    )
    figure.update_layout(
        title=chart_text(title),
        xaxis_title="decode tokens/s ÷ full cache's",
        yaxis_title="average score (selected budget)",
    )
    return figure


def head_to_head(rows: pd.DataFrame, title: str) -> go.Figure:
    """Each task's paired difference A − B with its 95% interval, the pooled rows below, zero marked."""
    ordered = rows.iloc[::-1]  # plotly draws the first category at the bottom: keep the table's order
    pooled = ordered["task"].str.startswith("pooled")
    figure = go.Figure()
    for name, part, symbol in (
        ("per task", ordered[~pooled], "circle"),
        ("pooled", ordered[pooled], "diamond"),
    ):
        figure.add_trace(
            go.Scatter(
                x=part["Δ (A − B)"],
                y=part["task"].map(chart_text),
                mode="markers",
                name=name,
                marker={"symbol": symbol, "size": 10},
                error_x=_bars(part, "Δ (A − B)"),
            )
        )
    figure.add_vline(x=0, line={"dash": "dash", "color": "gray"})
    figure.update_layout(
        title=chart_text(title), xaxis_title="paired difference A − B (95% CI)", yaxis_title=None
    )
    figure.update_yaxes(
        type="category", categoryorder="array", categoryarray=list(ordered["task"].map(chart_text))
    )
    return figure

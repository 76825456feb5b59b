"""Plotly figures of a value analysis, drawn from its tidy table (the CLI's files and the leaderboard's
Analysis view draw the same figures from the same rows)."""

from __future__ import annotations

import itertools
from typing import Any


def correlation_bars(table: Any) -> Any:
    """Per layer: Pearson's and Spearman's correlation of Range(v) with the quantization error, per bit
    width."""
    import plotly.express as px

    parts = table["statistic"].str.extract(r"^(?P<kind>pearson|spearman)_range_v_error_(?P<bits>\d+)bit$")
    rows = table[parts["kind"].notna()].copy()
    rows["correlation"] = parts["kind"]
    rows["bits"] = parts["bits"] + "-bit"
    figure = px.bar(
        rows, x="layer", y="value", color="bits", facet_row="correlation", barmode="group",
        title="Range(v) against per-token quantization error, per layer",
    )  # fmt: skip
    figure.update_yaxes(range=[-1, 1], title="correlation")
    return figure


def range_histograms(table: Any) -> Any:
    """Each layer's Range(v) histogram (all heads and tokens), from the stored bins."""
    import plotly.graph_objects as go

    figure = go.Figure()
    for layer, rows in table[table["head"].isna()].groupby("layer"):
        values = dict(zip(rows["statistic"], rows["value"], strict=True))
        lefts = sorted(k for k in values if k.endswith("_left"))
        counts = [values[k.replace("_left", "_count")] for k in lefts]
        edges = [values[k] for k in lefts] + [values["range_v_hist_right"]]
        centres = [(a + b) / 2 for a, b in itertools.pairwise(edges)]
        figure.add_trace(go.Scatter(x=centres, y=counts, mode="lines", name=f"layer {layer}"))
    figure.update_layout(title="Range(v) histograms per layer", xaxis_title="Range(v)", yaxis_title="tokens")
    figure.update_yaxes(type="log")
    return figure


def position_heatmap(table: Any) -> Any:
    """Mean Range(v) by layer and position bin (averaged over the KV heads)."""
    import plotly.express as px

    rows = table[table["statistic"].str.startswith("range_v_mean_position_bin_")].copy()
    rows["bin"] = rows["statistic"].str.rsplit("_", n=1).str[-1].astype(int)
    grid = rows.groupby(["layer", "bin"])["value"].mean().unstack("bin")
    return px.imshow(
        grid,
        aspect="auto",
        labels={"x": "position bin (early → late)", "y": "layer", "color": "mean Range(v)"},
        title="Range(v) by position",
    )


FIGURES = {"correlation": correlation_bars, "histograms": range_histograms, "positions": position_heatmap}

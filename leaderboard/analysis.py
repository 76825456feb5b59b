"""The Analysis view: `kvbench analyze values` tables, drawn with the figures the CLI writes."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from kvbench.store.board_tables import tables
from kvbench.store.ingest import reading


def value_analyses(database: Path) -> pd.DataFrame:
    """Every stored value analysis (its tidy rows), or no row where none was ingested."""
    with reading(database) as con:
        if "value_analysis" not in tables(con):
            columns = ["analysis_id", "model", "task", "problems", "tokens", "layer", "head", "statistic"]
            return pd.DataFrame(columns=[*columns, "value", "settings"])
        return con.execute(
            "SELECT analysis_id, model, task, problems, tokens, layer, head, statistic, value, settings "
            "FROM value_analysis ORDER BY model, task, layer, head, statistic"
        ).df()


def analysis_view(query) -> None:
    from kvbench.analysis.figures import FIGURES

    rows = query("value_analyses")
    if rows.empty:
        st.info("No value analysis stored: `kvbench analyze values --model NAME --task fidelity` makes one.")
        return
    labels = {
        f"{r.model} · {r.task} · {r.problems} traces, {r.tokens} tokens · {r.analysis_id[:8]}": r.analysis_id
        for r in rows.drop_duplicates("analysis_id").itertuples()
    }
    chosen = labels[st.selectbox("Analysis", list(labels), key="analysis")]
    table = rows[rows["analysis_id"] == chosen]
    st.caption(
        "Range(v) = max − min of a token's value vector over the head dimension; the error is each token's "
        f"RMS error after per-token asymmetric quantization (settings: {table['settings'].iloc[0]})."
    )
    for name, draw in FIGURES.items():
        st.plotly_chart(draw(table), key=f"analysis_{name}")

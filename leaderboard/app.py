"""The kvbench leaderboard page: layout only; every number comes from kvbench.leaderboard.queries.

Started by `kvbench leaderboard [--db PATH] [--port N]`, which names the database in
KVBENCH_LEADERBOARD_DB (default: the published snapshot runs/kvbench.snapshot.duckdb).
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import streamlit as st

from kvbench.leaderboard import charts, queries
from kvbench.results.stats import DRAWS
from kvbench.results.summary import QUANTITIES

DATABASE_ENV = "KVBENCH_LEADERBOARD_DB"
DEFAULT_DATABASE = Path("runs") / "kvbench.snapshot.duckdb"
BADGE_MARKDOWN = {
    "beats null": ":green-badge[beats null]",
    "ties": ":gray-badge[ties]",
    "loses": ":red-badge[loses]",
}
METHOD = (
    "Cells: pass@1 (or the probe's metric) ± half-width of a 95% bootstrap CI over problems "
    f"({DRAWS:,} draws). *average* pools the tasks, clustered by (task, problem). Δ vs null and the "
    "verdict: paired exact sign test against Random Attention on shared problems, Holm-corrected across "
    "this table's policies at α = 0.05. K/N_avg: the budget over the task's reference mean length."
)


@st.cache_data(show_spinner=False, max_entries=256)
def _query(name: str, database: str, stamp: float, *args):
    """Queries cached per database file version: a newly published snapshot is read afresh."""
    return getattr(queries, name)(Path(database), *args)


def main() -> None:
    st.set_page_config(page_title="kvbench leaderboard", layout="wide")
    st.title("kvbench leaderboard")
    database = Path(os.environ.get(DATABASE_ENV, DEFAULT_DATABASE))
    if not queries.has_results(database):
        _empty_page(database)
        return
    stamp = database.stat().st_mtime

    def query(name: str, *args):
        return _query(name, str(database), stamp, *args)

    st.caption("Which KV-cache eviction policies beat random eviction, at which budgets, on which models.")
    everything = query("choices")
    model = st.sidebar.selectbox("model", everything.models, key="model")
    protocol = st.sidebar.selectbox("protocol", query("choices", model).protocols, key="protocol")
    runtime = st.sidebar.selectbox(
        "runtime (adapter/device/dtype/attention)", query("choices", model, protocol).runtimes, key="runtime"
    )
    seed = st.sidebar.selectbox("protocol seed", query("choices", model, protocol, runtime).seeds, key="seed")
    compression = st.sidebar.selectbox(
        "compression",
        query("choices", model, protocol, runtime, seed).compressions,
        format_func=lambda c: c.label,
        key="compression",
    )
    name = st.sidebar.text_input("policy name contains", key="name")
    quantity = st.sidebar.selectbox(
        "rank by",
        list(QUANTITIES),
        key="quantity",
        help="the task's metric, or the probe answer's log-probability (paired and tested the same way)",
    )
    st.sidebar.caption(f"database: {database} (read-only)")
    if protocol is None or compression is None:
        st.info(f"No budgeted runs for {model} yet.")
        return
    table = query("leaderboard", model, protocol, compression, name, runtime, seed, quantity)
    views = st.tabs(["Leaderboard", "Budget curves", "Efficiency", "Policy", "Provenance"])
    with views[0]:
        _leaderboard_view(table, model, protocol, compression)
    with views[1]:
        _curves_view(query, model, protocol, runtime, seed, quantity)
    with views[2]:
        _efficiency_view(query, model, table)
    with views[3]:
        _policy_view(query, table)
    with views[4]:
        st.dataframe(query("provenance", table.run_ids), hide_index=True)
        st.caption("Every run behind the leaderboard table: spec hash, versions, commit, hardware, date.")


def _empty_page(database: Path) -> None:
    st.info(f"No results in {database} yet.")
    st.markdown(
        "Produce some, then reload this page:\n\n"
        "```\nkvbench run                  # SmolLM2 on CPU, a few minutes\n"
        "kvbench run --suite probes   # every built-in policy at 2x, 4x, 8x\n"
        "kvbench leaderboard\n```\n"
        "Results land in `runs/`; this page reads the snapshot `runs/kvbench.snapshot.duckdb`."
    )


def _leaderboard_view(table: queries.Table, model: str, protocol: str, compression) -> None:
    st.subheader(f"{model} · {protocol} · {compression.label}")
    if table.frame.empty:
        st.info("No runs match these filters.")
        return
    if not (table.frame["role"] == "policy").any():
        st.info("No policy matches these filters; only the baselines are shown.")
    number = st.column_config.NumberColumn
    st.dataframe(
        table.frame,
        hide_index=True,
        column_order=[c for c in table.frame.columns if c != "average"],  # its text twin shows the CI
        column_config={
            "Δ vs null": number(format="%+.3f"),
            "Δ vs full": number(format="%+.3f"),
            "p (Holm)": number(format="%.3f"),
            "K/N_avg": number(format="%.2f"),
        },
    )
    badges = [
        f"**{row['policy']}** {BADGE_MARKDOWN[row['verdict']]}"
        for _, row in table.frame.iterrows()
        if row["verdict"] in BADGE_MARKDOWN
    ]
    if badges:
        st.markdown("Against the null: " + " · ".join(badges))
    st.download_button(
        "Download CSV", table.frame.to_csv(index=False), file_name="kvbench-leaderboard.csv", mime="text/csv"
    )
    over = ", ".join(table.average_over) or "none"
    st.caption(f"{METHOD} The average covers the tasks every arm here ran: {over}.")


def _curves_view(
    query, model: str, protocol: str, runtime: str | None, seed: int | None, quantity: str
) -> None:
    tasks = query("tasks", model, protocol)
    task = st.selectbox(
        "task", [None, *tasks], format_func=lambda t: t or "all tasks, pooled", key="curve_task"
    )
    curves = query("budget_curves", model, protocol, task, runtime, seed, quantity)
    if curves[curves["ratio"].notna()]["ratio"].nunique() < 1:
        st.info(
            f"No ratio-based runs with {quantity}: run a suite with `ratios:` "
            "(e.g. `kvbench run --suite probes`)."
        )
        return
    title = f"{model}, {task or 'all tasks pooled'}: {quantity} against compression"
    st.plotly_chart(charts.budget_curves(curves, title, quantity), key="curves")


def _efficiency_view(query, model: str, table: queries.Table) -> None:
    rows = query("efficiency", model, table.frame)
    if rows.empty:
        st.info(
            f"No decode benchmarks for {model}: run `kvbench bench decode --model {model} --out runs` "
            "to measure tokens/s and KV memory per policy."
        )
        return
    if "average" in rows:
        st.plotly_chart(charts.efficiency(rows, f"{model}: speed and score"), key="efficiency")
    st.dataframe(rows, hide_index=True)
    st.caption(
        "Speed and memory come from `kvbench bench decode` at its own fixed K; scores at the selected budget."
    )


def _policy_view(query, table: queries.Table) -> None:
    # the policies under test first, then the null and the full cache
    ordered = table.frame.sort_values(
        "role", key=lambda r: r.map({"policy": 0, "null": 1, "reference": 2}), kind="stable"
    )
    names = list(dict.fromkeys(ordered["policy"])) if not table.frame.empty else []
    if not names:
        st.info("No policy matches these filters.")
        return
    policy = st.selectbox("policy", names, key="policy")
    _describe(query("policy_documentation", policy), policy)
    runs = query("policy_runs", policy)
    st.dataframe(runs.drop(columns=["run_id"]), hide_index=True)
    labels = {
        f"{r.model} / {r.task} / {r.protocol} / {_budget(r.budget, r.ratio)} {r.parameters} "
        f"({r.visibility}, run {r.run_id[:8]})": (r.run_id, r.visibility)
        for r in runs.itertuples()
    }
    chosen = st.selectbox("problems of run", list(labels), key="drill")
    run_id, visibility = labels[chosen]
    rows: pd.DataFrame = query("problems", run_id)
    if visibility != "public":
        st.caption("A private task: only problem ids and verdicts are shown, never its text or outputs.")
        rows = rows.drop(columns=["output"])
    st.dataframe(rows, hide_index=True)


def _budget(budget, ratio) -> str:
    if pd.isna(budget):
        return "no eviction"
    return f"K={int(budget)}" + (f" (N_avg/{ratio:g})" if not pd.isna(ratio) else "")


def _describe(doc: dict | None, policy: str) -> None:
    if doc is None:
        st.caption(f"{policy}: no documentation was stored with its runs.")
        return
    st.markdown(f"**{policy}** — {doc['summary']}")
    if doc["module_doc"]:
        st.markdown(doc["module_doc"])
    needs = ", ".join(doc["needs"]) or "nothing beyond keys and values"
    st.caption(f"source: {doc['module']} (as stored with its newest run) · needs: {needs}")


if __name__ == "__main__":
    main()

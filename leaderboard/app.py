"""The kvbench leaderboard page: layout only; every number comes from kvbench.leaderboard's query modules.

Started by `kvbench leaderboard [--db PATH] [--port N] [--public]`, which names the database in
KVBENCH_LEADERBOARD_DB (default: the published snapshot runs/kvbench.snapshot.duckdb) and public mode in
KVBENCH_LEADERBOARD_PUBLIC; the Space and container entry point (deploy/space/app.py) calls ``main``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from kvbench.errors import StorageError
from kvbench.leaderboard import analysis, charts, curves, downloads, permalink, queries, retention
from kvbench.leaderboard import head_to_head as h2h
from kvbench.leaderboard.about import ABOUT
from kvbench.leaderboard.display import MISSING, code, literal, split_shared
from kvbench.leaderboard.public import OUTPUT_CAP, ROW_CAP, public_mode, scrub_frame
from kvbench.results.stats import DRAWS
from kvbench.results.summary import QUANTITIES
from kvbench.specs.resolved import Role

DATABASE_ENV = "KVBENCH_LEADERBOARD_DB"
DEFAULT_DATABASE = Path("runs") / "kvbench.snapshot.duckdb"
VIEWS = [
    "Leaderboard",
    "Head-to-head",
    "Budget curves",
    "Retention",
    "Efficiency",
    "Policy",
    "Provenance",
    "Downloads",
    "Analysis",
    "About",
]
BADGE_MARKDOWN = {
    "beats null": ":green-badge[beats null]",
    "practically equivalent": ":blue-badge[practically equivalent]",
    "equivalent": ":blue-badge[equivalent]",
    "inconclusive": ":gray-badge[inconclusive]",
    "loses": ":red-badge[loses]",
}
MEMORY_COLUMNS = ("K held/N_avg", "bytes/token", "byte budget (MiB)")
METHOD = (
    "Cells: pass@1 (or the probe's metric) ± half-width of a 95% bootstrap CI over problems "
    f"({DRAWS:,} draws). Δ vs null: the mean paired difference with its 95% interval (exact for one "
    "pass/fail sample per problem, studentized bootstrap otherwise). *beats*/*loses*: the exact sign "
    "test and the test of Δ agree at α = 0.05, Holm-corrected within a family: a task's verdicts across "
    "the policies of that task's table (one task at one budget, as `kvbench compare`), a pooled column's "
    "across the policies of that pool, a family of its own that the per-task columns are not in (the "
    "families are listed below); *equivalent*: two one-sided tests put Δ inside ±margin, the margin in "
    "the metric's units as the task or protocol declares it (exact, or bootstrap-t from 30 problems; "
    "Holm-corrected too); *practically "
    "equivalent*: both; *inconclusive*: neither, with the problems that "
    "would give a decided verdict 80% power at the observed differences, and which verdict. MDE: the "
    "smallest effect these problems detect with 80% power. Tokens × full: mean generated tokens over "
    "the full cache's. K/N_avg: the budget over the task's reference mean length; K held/N_avg, "
    "bytes/token, byte budget: the tokens "
    "the cache held after each event, what one cost and what they cost together per sequence (a "
    "mixed-precision protocol holds more tokens in the same bytes). Each submission's policies are paired "
    "with its own null and full cache, and Holm-corrected among themselves. *re-computed*: every number "
    "of a submitted row is the maintainer's, computed again whole on their machine (`kvbench verify`); "
    "*(claim differed)*: the outputs the submission claimed were not those, and the board shows the "
    "maintainer's; *local*: runs no submission holds. A submission is scored only once re-computed."
)
TRAILING = ("K/N_avg", "problems × samples")
PINNED_VERDICTS = 1  # verdict columns pinned beside the policy, at most: Streamlit unpins every column
# when the pinned ones take more than 60% of the table, as two verdicts and the policy do at 800 px
POOLS_HELP = (
    "Tasks are pooled only with tasks whose metric is of the same kind: pass/fail (a grader's verdict, "
    "exact retrieval), a proportion (top-1 agreement), or an unbounded metric with itself."
)


def verdict_columns(table: queries.Table, pooled: bool) -> list[str]:
    """The verdict columns a view shows: each task's, as `kvbench compare` gives them (one task: its
    table's *verdict*); ``pooled``: each pool's, as `kvbench compare --pool` gives them, beside the
    verdicts of the tasks no pool holds."""
    columns = list(table.frame.columns)
    if not table.per_task:
        return [c for c in ("verdict",) if c in columns]
    alone = table.tasks
    shown: list[str] = []
    if pooled:
        pooled_tasks = {t for tasks in table.pools.values() for t in tasks}
        alone = [t for t in table.tasks if t not in pooled_tasks]
        shown = [
            "verdict" if label == "average" else queries.column(label, "verdict") for label in table.pools
        ]
    shown += [queries.column(t, "verdict") for t in alone]
    return [c for c in shown if c in columns]


def shown_columns(table: queries.Table, wide: bool, pooled: bool = False) -> list[str]:
    """The main table's columns in display order: the policy and the verdicts, each task's (``pooled``:
    each pool's) with its score, Δ vs null and Holm p when there is one, then (``pooled``) the averages
    that pool tasks of one kind and the tasks, then the budget; "all columns" adds the rest. The memory
    columns appear only where they say something: when a table's arms held other than K tokens or paid
    other than one byte cost per token (mixed precision), never for eviction alone."""
    columns = list(table.frame.columns)
    verdicts = verdict_columns(table, pooled)
    tested = verdicts
    if len(verdicts) == 1:  # one comparison: its score, Δ vs null and Holm p beside its verdict
        prefix = verdicts[0][: -len("verdict")]
        tested = [verdicts[0], prefix.strip() or "average ± CI", prefix + "Δ vs null", prefix + "p (Holm)"]
    averages = [  # each task apart by default, as `kvbench compare` shows them; pools on request
        c
        for c in ("average ± CI", *(label for label in table.pools if label != "average"))
        if c in columns and (pooled or not table.per_task)
    ]
    memory = [c for c in MEMORY_COLUMNS if c in columns and _memory_informative(table.frame)]
    shown = ["policy", *tested, *averages, *table.tasks, *TRAILING[:1], *memory, *TRAILING[1:]]
    if wide:  # "average" itself never: its text twin shows the interval
        shown += [c for c in columns if c not in shown and c not in MEMORY_COLUMNS and c != "average"]
    return [c for c in dict.fromkeys(shown) if c in columns]


def _memory_informative(frame: pd.DataFrame) -> bool:
    held = frame[["K held/N_avg", "K/N_avg", "bytes/token"]].dropna()
    more_tokens = (held["K held/N_avg"] - held["K/N_avg"]).abs().gt(0.005).any()
    return bool(more_tokens or held["bytes/token"].nunique() > 1)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    f.__name__: f
    for f in (
        queries.choices,
        queries.leaderboard,
        curves.budget_curves,
        curves.curve_groups,
        queries.efficiency,
        queries.eviction_cost,
        queries.policy_runs,
        queries.problems,
        queries.provenance,
        queries.trust_notices,
        queries.policy_documentation,
        h2h.head_to_head,
        downloads.sample_count,
        analysis.value_analyses,
        retention.retention_figures,
    )
}


@st.cache_data(show_spinner=False, max_entries=256)
def _query(name: str, database: str, stamp: float, *args):
    """Queries cached per database file version: a newly published snapshot is read afresh."""
    return _FUNCTIONS[name](Path(database), *args)


@dataclass(frozen=True)
class Selection:
    """The sidebar's filters: one table."""

    model: str
    protocol: str | None
    runtime: str | None
    seed: int | None
    compression: queries.Compression | None
    name: str
    quantity: str


def main(database: Path | None = None, public: bool | None = None) -> None:
    st.set_page_config(page_title="kvbench leaderboard", layout="wide")
    st.title("kvbench leaderboard")
    database = database or Path(os.environ.get(DATABASE_ENV, DEFAULT_DATABASE))
    public = public_mode() if public is None else public
    try:
        _page(database, public)
    except StorageError as exc:  # an empty or damaged file: named, with how to rebuild it
        st.error(
            "The results database cannot be read; its maintainer must rebuild it." if public else str(exc)
        )


def _page(database: Path, public: bool) -> None:
    if not queries.has_results(database):
        _empty_page(database, public)
        return
    stamp = database.stat().st_mtime

    def query(name: str, *args):
        return _query(name, str(database), stamp, *args)

    st.caption("Which KV-cache eviction policies beat random eviction, at which budgets, on which models.")
    chosen = _sidebar(query)
    if public:
        st.sidebar.caption(f"Published snapshot of {pd.Timestamp(stamp, unit='s'):%Y-%m-%d %H:%M} UTC.")
    else:
        st.sidebar.caption(f"database: {database} (read-only)")
    permalink.from_url("view", VIEWS)
    views = dict(zip(VIEWS, st.tabs(VIEWS, key="view", on_change="rerun"), strict=True))
    with views["About"]:
        st.markdown(ABOUT)
    with views["Analysis"]:
        analysis.analysis_view(query)
    if chosen.protocol is None or chosen.compression is None:
        st.info(f"No budgeted runs for {literal(chosen.model)} yet.")
        _remember(chosen)
        return
    table = query(
        "leaderboard", chosen.model, chosen.protocol, chosen.compression, chosen.name, chosen.runtime,
        chosen.seed, chosen.quantity,
    )  # fmt: skip
    with views["Leaderboard"]:
        _trust_view(query("trust_notices"))
        title = f"{literal(chosen.model)} · {literal(chosen.protocol)} · {chosen.compression.label}"
        _leaderboard_view(table, title)
    with views["Head-to-head"]:
        _head_to_head_view(query, table, chosen)
    with views["Budget curves"]:
        _curves_view(query, chosen)
    with views["Retention"]:
        retention.retention_view(query, table)
    with views["Efficiency"]:
        _efficiency_view(query, chosen.model, table, public)
    with views["Policy"]:
        _policy_view(query, table, public)
    with views["Provenance"]:
        runs = query("provenance", table.run_ids)
        differ, shared = split_shared(scrub_frame(runs) if public else runs, keep=("run_id", "label"))
        _table(differ, key="provenance_runs")
        st.caption(
            "Every run behind the leaderboard table: spec hash, versions, commit, hardware, date; for a "
            "submitted run its submission and newest verification, with the machine that re-ran it. What "
            "differs between the runs is in the table above, what all of them share below."
        )
        if not shared.empty:
            _table(shared, key="provenance_shared")
    with views["Downloads"]:
        _downloads_view(query, database, table)
    _remember(chosen)


def _sidebar(query) -> Selection:
    """The filters, each restored from the URL on the session's first run."""
    sidebar = st.sidebar

    def pick(key: str, label: str, options: Sequence, encode: Callable = str, **widget: Any) -> Any:
        permalink.from_url(key, options, encode)
        return sidebar.selectbox(label, options, key=key, **widget)

    model = pick("model", "model", query("choices").models)
    protocol = pick("protocol", "protocol", query("choices", model).protocols)
    runtime = pick(
        "runtime", "runtime (adapter/device/dtype/attention)", query("choices", model, protocol).runtimes
    )
    seed = pick("seed", "protocol seed", query("choices", model, protocol, runtime).seeds)
    compressions = query("choices", model, protocol, runtime, seed).compressions
    compression = pick(
        "compression", "compression", compressions, permalink.compression_code, format_func=lambda c: c.label
    )
    permalink.from_url("name")
    name = sidebar.text_input("policy name contains", key="name")
    quantity = pick(
        "quantity",
        "rank by",
        list(QUANTITIES),
        help="the task's metric, or the probe answer's log-probability (paired and tested the same way)",
    )
    return Selection(model, protocol, runtime, seed, compression, name, quantity)


def _remember(chosen: Selection) -> None:
    """The URL becomes a link to this page as shown: filters, tab, policy and head-to-head pair (each under
    its widget's key, which for a filter is its Selection field's name)."""
    state = st.session_state
    filters = {f.name: getattr(chosen, f.name) for f in fields(chosen)}
    filters["seed"] = None if chosen.seed is None else str(chosen.seed)
    filters["compression"] = permalink.compression_code(chosen.compression)
    permalink.to_url(filters | {key: state.get(key) for key in ("view", "policy", "pair_a", "pair_b")})


def _choose(key: str, options: Sequence[str], default: str) -> None:
    """Start widget ``key`` on ``default`` (or the URL's choice) unless it holds one of ``options``. A
    value the page chose itself follows a new default (a filter that brings a policy back brings it back
    into the pair); one the visitor chose stays."""
    permalink.from_url(key, options)
    state, page_choice = st.session_state, f"{key}:default"
    current = state.get(key)
    if current not in options or (current == state.get(page_choice) and current != default):
        state[key] = default
    state[page_choice] = default if state[key] == default else None


def _table(frame: pd.DataFrame, **config) -> None:
    st.dataframe(frame, hide_index=True, placeholder=MISSING, **config)


def _empty_page(database: Path, public: bool) -> None:
    if public:
        st.info("No results have been published yet.")
    else:
        st.info(f"No results in {database} yet.")
        st.markdown(
            "Produce some, then reload this page:\n\n"
            "```\nkvbench run                  # SmolLM2 on CPU, a few minutes\n"
            "kvbench run --suite probes   # every built-in policy at 2x, 4x, 8x\n"
            "kvbench leaderboard\n```\n"
            f"Results land in `runs/`, and `kvbench leaderboard` reads their snapshot "
            f"`{DEFAULT_DATABASE}`; this page reads `{database}`."
        )
    with st.expander("About kvbench and this leaderboard"):  # what the page would show, and how
        st.markdown(ABOUT)


def _trust_view(notices: queries.Notices) -> None:
    """Submissions waiting for re-computation, and runs that could not be re-computed: named above every
    table (their cells come from bundles, so they are shown as table cells, never Markdown)."""
    if not notices.failed.empty:
        st.error(
            f"{len(notices.failed)} submitted run(s) could not be re-computed here and never count: no "
            "verdict, pairing or curve on this board reads them."
        )
        _table(notices.failed, key="failed_runs")
    if not notices.pending.empty:
        st.info(
            f"{len(notices.pending)} submission(s) wait for the maintainer to re-compute them: listed, not "
            "scored, until every number of a run is computed here."
        )
        _table(notices.pending, key="pending_submissions")


def _leaderboard_view(table: queries.Table, title: str) -> None:
    st.subheader(title)
    if table.frame.empty:
        st.info("No runs match these filters.")
        return
    if not (table.frame["role"] == Role.POLICY).any():
        st.info("No policy matches these filters; only the baselines are shown.")
    if table.mismatched:  # marked "≠ null" in the table too; one line, so that the table stays in view
        st.warning(
            "Marked ≠ null: " + "; ".join(map(literal, table.mismatched)) + ". Their cells average their "
            "own problems, while Δ vs null, W/T/L and the verdicts pair the problems both ran."
        )
    number = st.column_config.NumberColumn
    left, right = st.columns(2)
    wide = left.toggle("all columns", key="wide", help="margin, MDE, power, token costs, parameters, badges")
    poolable = table.per_task and any(len(tasks) > 1 for tasks in table.pools.values())
    pooled = poolable and right.toggle(
        "pool tasks of one kind", key="pooled", help=f"as `kvbench compare --pool`. {POOLS_HELP}"
    )
    order = shown_columns(table, wide, pooled)
    verdicts = verdict_columns(table, pooled)
    _table(
        table.frame,
        column_order=order,
        column_config={
            "policy": st.column_config.TextColumn(pinned=True),
            **{v: st.column_config.TextColumn(pinned=len(verdicts) <= PINNED_VERDICTS) for v in verdicts},
            "average ± CI": st.column_config.TextColumn(help=_pooled_text(table)),
            **{
                c: number(format=f)
                for c in order
                for suffix, f in NUMBER_FORMATS.items()
                if c == suffix or c.endswith(f" {suffix}")
            },
        },
    )
    badges = [_badge_line(row, verdicts) for _, row in table.frame.iterrows()]
    if any(badges):
        st.markdown("Against the null: " + " · ".join(b for b in badges if b))
    frame = table.frame
    left, right, _ = st.columns([1, 1, 4])
    for place, (kind, (encode, mime)) in zip((left, right), downloads.FORMATS.items(), strict=True):
        place.download_button(
            f"Download {kind}", downloads.deferred(encode, lambda: frame), mime=mime,
            file_name=f"kvbench-leaderboard.{kind.lower()}", on_click="ignore",
        )  # fmt: skip
    st.caption(f"{METHOD} {_pooled_text(table)}")
    if table.families:  # a family's text names tasks and pools that may come from a bundle: shown literally
        st.caption("Holm families: " + "; ".join(map(literal, table.families)) + ".")


NUMBER_FORMATS = {
    "Δ vs null": "%+.3f",
    "Δ vs full": "%+.3f",
    "p (Holm)": "%.3f",
    "margin": "±%.3f",
    "tokens × full": "%.2f",
    "tokens / correct": "%.0f",
    "Δ tokens vs null": "%+.0f",
    "Δ trunc vs null": "%+.2f",
    "K/N_avg": "%.2f",
    "K held/N_avg": "%.2f",
    "bytes/token": "%.0f",
    "byte budget (MiB)": "%.2f",
}  # how each numeric column is written, also as the last words of a task's or a pool's column


def _badge_line(row: pd.Series, verdicts: list[str]) -> str:
    """One arm's verdicts as badges: "**snapkv** inconclusive", or per task "**snapkv** passkey
    inconclusive, fidelity beats null"."""
    found = [
        (literal(name[: -len("verdict")].strip()), BADGE_MARKDOWN[row[name]])
        for name in verdicts
        if row[name] in BADGE_MARKDOWN
    ]
    if not found:
        return ""
    return f"**{literal(row['policy'])}** " + ", ".join(f"{label} {badge}".strip() for label, badge in found)


def _pooled_text(table: queries.Table) -> str:
    """What the verdicts are and what each average pools: the tasks with their metrics' kinds."""
    # a task's name may come from a bundle: Markdown's characters in it are shown, never read
    named = ", ".join(
        f"{literal(t)} ({table.metrics[t]})" if t in table.metrics else literal(t) for t in table.tasks
    )
    if not table.per_task:
        return f"The task's metric: {named}."
    text = (
        "Each task's verdict, Δ vs null and Holm p are those of `kvbench compare` for that task (Holm "
        f"across the policies that ran it). The tasks' metrics: {named}. Tasks are pooled, each (task, "
        "problem) one cluster of equal weight, only with tasks of the same kind"
    )
    if "average" in table.pools:
        average = ", ".join(map(literal, table.average_over))
        return text + f": *average* pools {average}, as `kvbench compare --pool` does."
    if table.pools:
        pooled = "; ".join(f"*{label}* {', '.join(map(literal, ts))}" for label, ts in table.pools.items())
        return text + f": {pooled}; no average mixes kinds."
    return text + ": here no two tasks are of one kind, so nothing is pooled."


def _head_to_head_view(query, table: queries.Table, chosen: Selection) -> None:
    if len(table.arms) < 2:
        st.info("A head-to-head needs two arms in the table.")
        return
    labels = {h2h.arm_label(arm, table.arms): arm for arm in table.arms}
    names = list(labels)
    roles = [arm.role for arm in labels.values()]
    first_policy = names[roles.index(Role.POLICY)] if Role.POLICY in roles else names[0]
    baseline = next((n for n, r in zip(names, roles, strict=True) if r == Role.NULL), None)
    _choose("pair_a", names, first_policy)
    _choose("pair_b", names, baseline or next(n for n in names if n != first_policy))
    left, right = st.columns(2)
    a = left.selectbox("A", names, key="pair_a")
    b = right.selectbox("B", names, key="pair_b")
    if a == b:
        st.info("Choose two different arms.")
        return
    result = query(
        "head_to_head", chosen.model, chosen.protocol, chosen.compression, chosen.runtime, chosen.seed,
        chosen.quantity, labels[a], labels[b],
    )  # fmt: skip
    if result.tasks.empty:
        st.info(f"{literal(a)} and {literal(b)} ran no task in common here.")
        return
    st.plotly_chart(charts.head_to_head(result.tasks, f"A = {a} against B = {b}"), key="h2h_chart")
    _table(
        result.tasks.drop(columns=["low", "high"]),
        column_config={
            "Δ (A − B)": st.column_config.NumberColumn(format="%+.3f"),
            "p (sign test)": st.column_config.NumberColumn(format="%.3f"),
            "p (Holm, tasks)": st.column_config.NumberColumn(format="%.3f"),
        },
        key="h2h_tasks",
    )
    for note in result.notes:
        st.caption(literal(note))
    st.caption(
        f"Paired on the problems both ran ({chosen.quantity}); 95% bootstrap interval over problems, "
        "exact sign test on the problems where they differ; the per-task p-values Holm-corrected across "
        "these tasks. *unpaired*: problems only one arm has, left out."
    )
    problems = result.problems
    _table(problems.frame, key="h2h_problems")
    _cap_note(problems, "problems")
    st.caption("Per problem: the mean over its samples for each arm. A private task shows its ids only.")


def _cap_note(rows: queries.Capped, what: str) -> None:
    if rows.capped:
        st.caption(f"The first {len(rows.frame):,} of {rows.total:,} {what} are shown.")


def _curves_view(query, chosen: Selection) -> None:
    model, protocol, quantity = chosen.model, chosen.protocol, chosen.quantity
    groups = query("curve_groups", model, protocol, quantity)
    task = st.selectbox("tasks", list(groups), key="curve_task", help=POOLS_HELP)
    lines = query("budget_curves", model, protocol, groups.get(task), chosen.runtime, chosen.seed, quantity)
    if lines[lines["ratio"].notna()]["ratio"].nunique() < 1:
        st.info(
            f"No ratio-based runs with {quantity}: run a suite with `ratios:` "
            "(e.g. `kvbench run --suite probes`)."
        )
        return
    if lines["ratio"].nunique() == 1:
        st.info(
            "These runs have one compression ratio, so each arm is a point, not a curve: a budget curve "
            "needs several (`kvbench run --suite probes` runs every built-in policy at 2x, 4x and 8x)."
        )
    title = f"{model}, {task}: {quantity} against compression"
    st.plotly_chart(charts.budget_curves(lines, title, quantity), key="curves")


def _efficiency_view(query, model: str, table: queries.Table, public: bool) -> None:
    cost = query("eviction_cost", table.run_ids)
    if not cost.empty:
        st.subheader("Eviction cost in these runs")
        _table(cost)
        st.caption(
            "Milliseconds per eviction event of one sample (its share of its batch's event), from the runs "
            "in this table, and that over the null's: what choosing what to evict costs beside random. "
            "`kvbench bench evict` times one event per policy side by side at the papers' shapes."
        )
    rows = query("efficiency", model, table.frame)
    if rows.empty:
        st.info(
            f"No decode benchmarks for {literal(model)}: run "
            f"{code(f'kvbench bench decode --model {model} --out runs')} "
            "to measure tokens/s and KV memory per policy."
        )
        return
    if "average" in rows:
        st.plotly_chart(charts.efficiency(rows, f"{model}: speed and score"), key="efficiency")
    elif "average" not in table.frame:
        st.caption("No chart of speed against score: this table's tasks have metrics of different kinds, "
                   "which no one average pools; a table of one kind of task has it.")  # fmt: skip
    _table(scrub_frame(rows) if public else rows)
    st.caption(
        "Speed and memory come from `kvbench bench decode` at its own fixed K; scores at the selected budget."
    )


def _policy_view(query, table: queries.Table, public: bool) -> None:
    # the policies under test first, then the null and the full cache
    ordered = table.frame.sort_values(
        "role", key=lambda r: r.map({Role.POLICY: 0, Role.NULL: 1, Role.REFERENCE: 2}), kind="stable"
    )
    names = list(dict.fromkeys(ordered["policy"])) if not table.frame.empty else []
    if not names:
        st.info("No policy matches these filters.")
        return
    permalink.from_url("policy", names)
    policy = st.selectbox("policy", names, key="policy")
    _describe(query("policy_documentation", policy), policy)
    runs = query("policy_runs", policy)
    _table(scrub_frame(runs.drop(columns=["run_id"])) if public else runs.drop(columns=["run_id"]))
    labels = {
        f"{r.model} / {r.task} / {r.protocol} / {_budget(r.budget, r.ratio)} {r.parameters} "
        f"({r.visibility}, run {r.run_id[:8]})": (r.run_id, r.visibility)
        for r in runs.itertuples()
    }
    chosen = st.selectbox("problems of run", list(labels), key="drill")
    run_id, visibility = labels[chosen]
    rows: queries.Capped = query("problems", run_id)
    frame = rows.frame
    if visibility != "public":
        st.caption("A private task: only problem ids and verdicts are shown, never its text or outputs.")
        frame = frame.drop(columns=["output"])
    _table(frame)
    _cap_note(rows, "sample rows")


def _downloads_view(query, database: Path, table: queries.Table) -> None:
    frame, run_ids = table.frame, table.run_ids
    files: dict[str, tuple[str, Callable[[], pd.DataFrame]]] = {
        "the leaderboard table": ("kvbench-leaderboard", lambda: frame),
        "the runs behind it": ("kvbench-runs", lambda: downloads.published_runs(database, run_ids)),
        "their samples": ("kvbench-samples", lambda: downloads.published_samples(database, run_ids).frame),
    }
    for label, (stem, rows) in files.items():
        # built when clicked (on Streamlit's thread for it), never on a page run
        for kind in ("Parquet", "CSV"):
            encode, mime = downloads.FORMATS[kind]
            st.download_button(
                f"{label} ({kind})", downloads.deferred(encode, rows), file_name=f"{stem}.{kind.lower()}",
                mime=mime, on_click="ignore", key=f"get_{stem}_{kind}",
            )  # fmt: skip
    total = query("sample_count", run_ids)
    capped = f"; the files hold the first {ROW_CAP:,}" if total > ROW_CAP else ""
    st.caption(
        f"The table as shown; its {len(run_ids)} runs (without their resolved specs, which name local "
        f"paths; hardware as CPU and GPU models); their {total:,} sample rows{capped}, each output cut at "
        f"{OUTPUT_CAP:,} characters, and no output of a private task."
    )
    st.markdown(downloads.LICENCE)


def _budget(budget, ratio) -> str:
    if pd.isna(budget):
        return "no eviction"
    return f"K={int(budget)}" + (f" (N_avg/{ratio:g})" if not pd.isna(ratio) else "")


def _describe(docs: list[dict], policy: str) -> None:
    """A policy's stored documentation, one per source (one's own runs, each submission that ships a policy
    of this name), as plain text: a submitted run brings its own, and Markdown in it must neither fetch an
    image nor add a heading to the page."""
    if not docs:
        st.text(f"{policy}: no documentation was stored with its runs.")
        return
    for doc in docs:
        whose = f" (from {doc['from']})" if len(docs) > 1 else ""
        st.text(f"{policy}{whose} — {doc['summary']}")
        if doc["module_doc"]:
            st.text(doc["module_doc"])
        needs = ", ".join(doc["needs"]) or "nothing beyond keys and values"
        st.text(f"source: {doc['module']} (as stored with its newest run) · needs: {needs}")


if __name__ == "__main__":
    main()

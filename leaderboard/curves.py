"""The budget curves: a score (or another of QUANTITIES) against compression ratio per arm, with 95% CIs,
pooled over tasks of one kind of metric; each submission on a board draws its own lines."""

from __future__ import annotations

import json
from dataclasses import astuple
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from kvbench.leaderboard.display import setting_label
from kvbench.leaderboard.queries import context_or_first
from kvbench.results.comparison import RUNTIME
from kvbench.results.stats import bootstrap_mean, pool
from kvbench.results.summary import QUANTITIES, most_complete, summarize
from kvbench.specs.metric_kind import pools, task_metric
from kvbench.specs.resolved import Role
from kvbench.specs.task import TaskSpec
from kvbench.store.board_tables import counted_runs
from kvbench.store.ingest import reading

_CURVE_RUNS = f"""
SELECT run_id, task, policy, policy_params, role, ratio, source FROM {{runs}} runs
WHERE model = ? AND protocol = ? AND {RUNTIME} = ? AND protocol_seed = ?
  AND (ratio IS NOT NULL OR role = ?)
  AND list_contains(?, task)
ORDER BY created, run_id
"""


class _CurveRun(NamedTuple):
    run_id: str
    task: str
    policy: str
    params: str
    role: Role
    ratio: float | None
    source: str


def budget_curves(
    database: Path,
    model: str,
    protocol: str,
    tasks: tuple[str, ...] | None = None,
    runtime: str | None = None,
    seed: int | None = None,
    quantity: str = "score",
) -> pd.DataFrame:
    """Score (or another of QUANTITIES) against compression ratio per arm, pooled over ``tasks`` (those
    of them that have it; None: the first of curve_groups, never tasks of two kinds), with 95% CIs.

    An arm is a policy with its parameters: a policy run with two settings draws two lines, labelled by
    their parameters. The full cache has no ratio: it appears once, with ``ratio`` missing, to be drawn
    as a line over the same tasks as the curves.
    """
    if tasks is None:
        tasks = next(iter(curve_groups(database, model, protocol, quantity).values()), ())
    with reading(database) as con:
        runtime, seed = context_or_first(con, model, protocol, runtime, seed)
        query = _CURVE_RUNS.format(runs=counted_runs(con))
        found = con.execute(query, [model, protocol, runtime, seed, Role.REFERENCE, list(tasks)]).fetchall()
        runs = [run._replace(role=Role(run.role)) for run in map(_CurveRun._make, found)]
        summaries = summarize(con, [r.run_id for r in runs], quantity)
    runs = most_complete(runs, summaries, key=lambda r: r[1:])  # one run per arm, task and ratio
    swept = {r.task for r in runs if r.ratio is not None}
    settings: dict[str, set[str]] = {}
    sources = {r.source for r in runs}
    groups: dict[tuple[str, str, Role, float | None, str], dict[str, dict[str, float]]] = {}
    for run in runs:
        if run.task in swept:  # the full cache's line pools the same tasks as the curves
            settings.setdefault(run.policy, set()).add(run.params)
            arm = (run.policy, run.params, run.role, run.ratio, run.source)
            groups.setdefault(arm, {})[run.task] = summaries[run.run_id].scores
    records = []
    for (policy, params, role, ratio, source), by_task in sorted(
        groups.items(), key=lambda g: (g[0][0], g[0][1], g[0][4], g[0][3] or 0)
    ):
        estimate = bootstrap_mean(list(pool(by_task).values()))
        label = policy if len(settings[policy]) == 1 else setting_label(policy, params)
        if len(sources) > 1:  # a board's submissions each draw their own lines
            label += f" @{source[:8]}" if source else " (local)"
        records.append((label, role, ratio, *astuple(estimate)))  # value, low, high, problems
    return pd.DataFrame.from_records(
        records, columns=["policy", "role", "ratio", "score", "low", "high", "problems"]
    )


def curve_groups(
    database: Path, model: str, protocol: str, quantity: str = "score"
) -> dict[str, tuple[str, ...]]:
    """What a budget curve can pool, label -> tasks: the swept tasks (run at a ratio) of each kind of metric
    pooled (where a kind has two or more; "all tasks" when every task is of one kind), then each alone."""
    with reading(database) as con:
        found = con.execute(
            f"SELECT task, any_value(spec->'task') FROM {counted_runs(con)} WHERE model = ? AND protocol = ? "
            "AND ratio IS NOT NULL GROUP BY task ORDER BY task",
            [model, protocol],
        ).fetchall()
    metrics = {
        task: task_metric(TaskSpec.model_validate(json.loads(spec)), QUANTITIES[quantity])
        for task, spec in found
    }
    by_kind = {label: tasks for label, tasks in pools(metrics, metrics).items() if len(tasks) > 1}
    groups = {
        ("all tasks" if len(by_kind) == 1 and len(tasks) == len(metrics) else f"{label} tasks")
        + f", pooled ({len(tasks)})": tuple(tasks)
        for label, tasks in by_kind.items()
    }
    return groups | {task: (task,) for task in metrics}

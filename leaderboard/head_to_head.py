"""Two arms of one leaderboard table side by side: on the tasks both ran, the paired difference per task
and pooled (tasks of one kind of metric only), with its bootstrap interval and the exact sign test, and
the per-problem outcomes.

The statistics are kvbench.results.stats's, as in every table: problems are matched by id within a
task, the interval resamples problems (pooled: (task, problem) clusters), and the sign test counts the
problems each arm scored higher on. The per-task p-values are Holm-corrected across this view's tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvbench.leaderboard.display import MISSING, setting_label
from kvbench.leaderboard.public import ROW_CAP
from kvbench.leaderboard.queries import ArmKey, Capped, Compression, table_runs
from kvbench.results.comparison import StoredRun, task_metrics
from kvbench.results.stats import PairedComparison, compare_arms, holm, pool
from kvbench.results.summary import most_complete, summarize
from kvbench.specs.metric_kind import pools
from kvbench.specs.resolved import Role
from kvbench.store.ingest import reading

WIN, TIE, LOSS = "A higher", "tie", "B higher"
ROLE_SUFFIX: dict[str, str] = {Role.NULL: " (null)", Role.REFERENCE: " (full cache)"}


def arm_label(arm: ArmKey, arms: Sequence[ArmKey]) -> str:
    """An arm's name in a menu: its policy, its parameters when the policy has several settings in the
    table, its role when it is the null or the full cache, and its submission when the table holds
    several."""
    settings = {a.params for a in arms if a.policy == arm.policy and a.role == arm.role}
    label = arm.policy if len(settings) == 1 else setting_label(arm.policy, arm.params)
    if len({a.source for a in arms}) > 1:
        label += f" @{arm.source[:8]}" if arm.source else " (local)"
    return label + ROLE_SUFFIX.get(arm.role, "")


@dataclass(frozen=True)
class HeadToHead:
    tasks: pd.DataFrame
    """One row per common task, then the pooled rows: Δ (A − B) with its interval, W/T/L, p-values."""
    problems: Capped
    """Per problem: task, problem id, score A, score B and which was higher (the first ROW_CAP rows)."""
    notes: list[str]


def head_to_head(
    database: Path,
    model: str,
    protocol: str,
    compression: Compression,
    runtime: str | None,
    seed: int | None,
    quantity: str,
    a: ArmKey,
    b: ArmKey,
) -> HeadToHead:
    with reading(database) as con:
        runs = [r for r in table_runs(con, model, protocol, compression, runtime, seed) if r.arm in (a, b)]
        summaries = summarize(con, [r.run_id for r in runs], quantity)
    # as in the table: an arm run twice on a task is represented by its run with the most samples
    chosen: dict[tuple[str, str, str, str], dict[str, StoredRun]] = {a: {}, b: {}}
    for run in most_complete(runs, summaries, key=lambda r: (r.task, *r.arm)):
        chosen[run.arm][run.task] = run
    common = sorted(set(chosen[a]) & set(chosen[b]))
    scores = {arm: {t: summaries[chosen[arm][t].run_id].scores for t in common} for arm in (a, b)}
    metrics = task_metrics(runs, quantity)
    rows = [_row(t, str(metrics[t]), compare_arms(scores[a][t], scores[b][t])) for t in common]
    for row, adjusted in zip(rows, holm([r["p (sign test)"] for r in rows]), strict=True):
        row["p (Holm, tasks)"] = adjusted
    by_kind = pools(metrics, common)
    for label, tasks in by_kind.items():  # like with like only: never a mean over two kinds of metric
        if len(tasks) > 1:
            first, second = (pool({t: scores[arm][t] for t in tasks}) for arm in (a, b))
            name = "pooled" if len(by_kind) == 1 else f"pooled, {label}"
            rows.append(_row(f"{name} ({len(tasks)} tasks)", label, compare_arms(first, second)))
    notes = [
        f"{t}: {chosen[a][t].samples} samples per problem for A, {chosen[b][t].samples} for B "
        "(each problem's mean is compared)"
        for t in common
        if chosen[a][t].samples != chosen[b][t].samples
    ]
    return HeadToHead(pd.DataFrame.from_records(rows, columns=COLUMNS), _problems(scores, a, b), notes)


COLUMNS = [
    "task",
    "kind",
    "problems",
    "Δ (A − B)",
    "95% CI",
    "low",
    "high",
    "W/T/L",
    "p (sign test)",
    "p (Holm, tasks)",
    "unpaired",
]


def _row(task: str, kind: str, paired: PairedComparison) -> dict:
    difference = paired.difference
    return {
        "task": task,
        "kind": kind,
        "problems": difference.problems,
        "Δ (A − B)": difference.value,
        "95% CI": f"[{difference.low:+.3f}, {difference.high:+.3f}]" if difference.problems else MISSING,
        "low": difference.low,
        "high": difference.high,
        "W/T/L": f"{paired.wins}/{paired.ties}/{paired.losses}",
        "p (sign test)": paired.p_value,
        "p (Holm, tasks)": None,
        "unpaired": len(paired.excluded),
    }


def _problems(scores: dict, a: ArmKey, b: ArmKey) -> Capped:
    """Problems both arms scored, task by task; a problem only one arm has is left out (as in the test)."""
    records = []
    for task, by_problem in scores[a].items():
        other = scores[b][task]
        for problem in sorted(set(by_problem) & set(other)):
            one, two = by_problem[problem], other[problem]
            outcome = WIN if one > two else LOSS if one < two else TIE
            records.append({"task": task, "problem_id": problem, "A": one, "B": two, "outcome": outcome})
    frame = pd.DataFrame.from_records(records[:ROW_CAP], columns=["task", "problem_id", "A", "B", "outcome"])
    return Capped(frame, len(records))

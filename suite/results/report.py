"""The table `kvbench run` ends with: one per task, each policy against the null and the full cache."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import duckdb

from kvbench.results.comparison import ArmResult, compare_table, stored_runs
from kvbench.results.stats import Estimate, PairedComparison
from kvbench.results.summary import summarize
from kvbench.runner.plan import Cell


@dataclass(frozen=True)
class ReportRow:
    model: str
    task: str
    metric: str
    policy: str
    role: str
    budget: int
    k_over_n_avg: float
    score: Estimate
    vs_null: Estimate | None
    vs_full: Estimate | None
    problems: int
    samples: int
    strict: Estimate | None = None
    """Strict pass@1: correct and finished before the token cap."""
    truncation_rate: float = math.nan
    no_answer_rate: float = math.nan
    mean_generated_tokens: float = math.nan
    null_test: PairedComparison | None = None
    """Sign test against the null with its Holm-corrected verdict (policies under test only)."""


def build_report(cells: Sequence[Cell], database: Path) -> list[ReportRow]:
    """One row per cell, in the cells' order; each (model, task, budget) is one table of the builder."""
    con = duckdb.connect(str(database), read_only=True)
    try:
        runs = {r.run_id: r for r in stored_runs(con, run_ids=[c.run_id for c in cells])}
        summaries = summarize(con, list(runs))
    finally:
        con.close()
    results: dict[str, ArmResult] = {}
    tables: dict[tuple[str, str, int | None], None] = dict.fromkeys(
        (c.model.name, c.task.name, c.budget) for c in cells if c.role != "reference"
    )
    # a full cache run without policies beside it is a table of its own
    tables.update(dict.fromkeys((c.model.name, c.task.name, None) for c in cells if c.role == "reference"))
    for model, task, budget in tables:
        table = [
            runs[c.run_id]
            for c in cells
            if (c.model.name, c.task.name) == (model, task)
            and (c.role == "reference" or (budget is not None and c.budget == budget))
        ]
        for arm in compare_table(table, summaries, tasks=(task,)):
            run = arm.runs[task]
            if run.role != "reference" or run.run_id not in results:  # the full cache: its first table
                results[run.run_id] = arm
    return [_row(cell, results[cell.run_id]) for cell in cells]


def _row(cell: Cell, arm: ArmResult) -> ReportRow:
    return ReportRow(
        model=cell.model.name,
        task=cell.task.name,
        metric=cell.task.metric,
        policy=cell.policy.name,
        role=cell.role,
        budget=cell.budget,
        k_over_n_avg=arm.k_over_n_avg,
        score=arm.score,
        vs_null=arm.vs_baseline,
        vs_full=arm.vs_full,
        problems=arm.score.problems,
        samples=cell.samples,
        strict=arm.strict,
        truncation_rate=arm.truncation_rate,
        no_answer_rate=arm.no_answer_rate,
        mean_generated_tokens=arm.mean_generated_tokens,
        null_test=arm.test,
    )


def as_dicts(rows: Sequence[ReportRow]) -> list[dict]:
    return [asdict(r) for r in rows]

"""The table `kvbench run` ends with: one per task, each policy against the null and the full cache."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import duckdb

from kvbench.runner.plan import Cell
from kvbench.runner.summary import summarize
from kvbench.stats import (
    Estimate,
    PairedComparison,
    bootstrap_mean,
    compare_arms,
    paired_difference,
    verdicts,
)


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
    con = duckdb.connect(str(database), read_only=True)
    try:
        summaries = summarize(con, [cell.run_id for cell in cells])
    finally:
        con.close()
    scores = {run_id: summary.scores for run_id, summary in summaries.items()}
    rows = []
    for cell in cells:
        same_task = [c for c in cells if (c.model.name, c.task.name) == (cell.model.name, cell.task.name)]
        null = next((c for c in same_task if c.role == "null" and c.budget == cell.budget), None)
        full = next((c for c in same_task if c.role == "reference"), None)
        summary = summaries[cell.run_id]
        mine = summary.scores
        rows.append(
            ReportRow(
                model=cell.model.name,
                task=cell.task.name,
                metric=cell.task.metric,
                policy=cell.policy.name,
                role=cell.role,
                budget=cell.budget,
                k_over_n_avg=cell.budget / cell.n_avg if cell.n_avg else math.nan,
                score=bootstrap_mean(list(mine.values())),
                vs_null=paired_difference(mine, scores[null.run_id]) if null and cell is not null else None,
                vs_full=paired_difference(mine, scores[full.run_id]) if full and cell is not full else None,
                problems=len(mine),
                samples=cell.samples,
                strict=bootstrap_mean(list(summary.strict.values())),
                truncation_rate=summary.truncation_rate,
                no_answer_rate=summary.no_answer_rate,
                mean_generated_tokens=summary.mean_generated_tokens,
            )
        )
    return _with_verdicts(rows, cells, scores)


def _with_verdicts(rows: list[ReportRow], cells: Sequence[Cell], scores: dict) -> list[ReportRow]:
    """Sign tests of each policy against its null, Holm-corrected across the policies of one table."""
    from dataclasses import replace

    tests: dict[int, PairedComparison] = {}
    for key in dict.fromkeys((c.model.name, c.task.name, c.budget) for c in cells):
        group = [i for i, c in enumerate(cells) if (c.model.name, c.task.name, c.budget) == key]
        null = next((cells[i] for i in group if cells[i].role == "null"), None)
        policies = [i for i in group if cells[i].role == "policy"]
        if null is None or not policies:
            continue
        compared = verdicts([compare_arms(scores[cells[i].run_id], scores[null.run_id]) for i in policies])
        tests.update(zip(policies, compared, strict=True))
    return [replace(row, null_test=tests.get(i)) for i, row in enumerate(rows)]


def as_dicts(rows: Sequence[ReportRow]) -> list[dict]:
    return [asdict(r) for r in rows]

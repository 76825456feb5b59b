"""``kvbench compare``: every stored policy against the null (or another baseline), from the database.

Rows are grouped into tables by (model, task, protocol, budget); within a table each policy's sign test
against the baseline is Holm-corrected across the policies compared. Declared task groups (``pools``,
e.g. AIME 2025 + 2026 + HMMT) are compared as one table per (model, protocol, ratio), their problems
clustered by (task, problem).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import SpecError
from kvbench.results.comparison import NO_BASELINE, ArmResult, StoredRun, compare_table, stored_runs
from kvbench.results.summary import CellSummary, summarize
from kvbench.specs.resolved import Role
from kvbench.store.ingest import reading


@dataclass(frozen=True)
class Filters:
    model: str | None = None
    task: str | None = None
    protocol: str | None = None
    budget: int | None = None
    against: str = "random"
    pools: tuple[tuple[str, tuple[str, ...]], ...] = ()
    seed: int | None = None
    """Only runs under this protocol seed (``kvbench run``'s own tables)."""
    quantity: str = "score"
    """What arms are ranked and paired by: a name in kvbench.results.summary.QUANTITIES."""
    """Declared task groups, (name, tasks): each also compared pooled, when every task has the arms."""


COLUMNS = (
    "model",
    "task",
    "protocol",
    "runtime",
    "seed",
    "samples_per_problem",
    "budget",
    "ratio",
    "k_over_n_avg",
    "policy",
    "params",
    "score",
    "score_low",
    "score_high",
    "strict",
    "truncation_rate",
    "no_answer_rate",
    "mean_generated_tokens",
    "delta",
    "delta_low",
    "delta_high",
    "wins",
    "ties",
    "losses",
    "p_holm",
    "verdict",
    "delta_full",
    "problems",
    "samples",
    "excluded",
)


def compare(database: Path, filters: Filters) -> list[dict]:
    with reading(database) as con:  # an empty or damaged file is named, with how to rebuild it
        # every filter is a bound parameter: widget or CLI values never become SQL
        runs = stored_runs(con, model=filters.model, protocol=filters.protocol)
        summaries = summarize(con, [r.run_id for r in runs], filters.quantity)
    runs = [r for r in runs if filters.seed is None or r.seed == filters.seed]
    stored = {r.task for r in runs}
    for name, tasks in filters.pools:
        missing = [t for t in tasks if t not in stored]
        if missing:
            raise SpecError(
                f"pool {name!r}: no stored runs of task(s) {', '.join(missing)}"
                + (f" for model {filters.model!r}" if filters.model else "")
                + f"; tasks with stored runs: {', '.join(sorted(stored)) or 'none'}"
            )
    rows = _per_task(runs, summaries, filters)
    for name, tasks in filters.pools:
        if filters.task is None or filters.task in (name, *tasks):
            rows += _pooled(name, tasks, runs, summaries, filters)
    return rows


def _tables(runs: list[StoredRun], key) -> dict[tuple, list[StoredRun]]:
    """The non-reference runs grouped by ``key`` (tables ordered by context, budget and policy; each
    table's runs kept in creation order, which decides which of two equal runs stands for an arm)."""
    members = [r for r in runs if r.role != Role.REFERENCE]
    ordered = sorted(members, key=lambda r: (r.context, r.budget or 0, r.policy, r.params))
    return {table: [r for r in members if key(r) == table] for table in dict.fromkeys(map(key, ordered))}


def _per_task(runs: list[StoredRun], summaries: dict[str, CellSummary], filters: Filters) -> list[dict]:
    runs = [r for r in runs if filters.task is None or r.task == filters.task]
    rows: list[dict] = []
    for (context, budget), members in _tables(runs, key=lambda r: (r.context, r.budget)).items():
        if filters.budget is not None and budget != filters.budget:
            continue
        references = [r for r in runs if r.role == Role.REFERENCE and r.context == context]
        arms = compare_table(members + references, summaries, tasks=(context[1],), baseline=filters.against)
        rows += [
            _row(context, budget, members[0].ratio, arm, pooled=False)
            for arm in _sorted(arms, filters.against)
        ]
    return rows


def _pooled(
    name: str,
    tasks: tuple[str, ...],
    runs: list[StoredRun],
    summaries: dict[str, CellSummary],
    filters: Filters,
) -> list[dict]:
    """One table per (model, protocol, runtime, seed, ratio or fixed K): arms that ran every task, pooled."""

    def shared(r: StoredRun) -> tuple:  # the pairing context without the task
        return r.model, r.protocol, r.runtime, r.seed

    members = [r for r in runs if r.task in tasks]
    rows: list[dict] = []
    for (context, ratio, budget), group in _tables(
        members, key=lambda r: (shared(r), r.ratio, None if r.ratio else r.budget)
    ).items():
        if filters.budget is not None and budget != filters.budget:
            continue
        references = [r for r in members if r.role == Role.REFERENCE and shared(r) == context]
        arms = compare_table(group + references, summaries, tasks=tasks, baseline=filters.against)
        if not any(a.policy == filters.against and a.role != Role.REFERENCE for a in arms):
            continue
        model, protocol, runtime, seed = context
        key = (model, name, protocol, runtime, seed)
        rows += [_row(key, budget, ratio, arm, pooled=True) for arm in _sorted(arms, filters.against)]
    return rows


def _sorted(arms: list[ArmResult], against: str) -> list[ArmResult]:
    """The arms a comparison lists (neither the baseline nor the full cache), by policy and parameters."""
    shown = [a for a in arms if a.role != Role.REFERENCE and a.policy != against]
    return sorted(shown, key=lambda a: (a.policy, a.params))


def _row(key: tuple, budget: int | None, ratio: float | None, arm: ArmResult, *, pooled: bool) -> dict:
    """One comparison row, formatted from the builder's result."""
    test = arm.test
    samples = None if pooled else next(iter(arm.runs.values())).samples
    values = (
        *key[:5],
        samples,
        budget,
        ratio,
        arm.k_over_n_avg,
        arm.policy,
        arm.params,
        arm.score.value,
        arm.score.low,
        arm.score.high,
        arm.strict.value,
        arm.truncation_rate,
        arm.no_answer_rate,
        arm.mean_generated_tokens,
        *(
            (
                test.difference.value,
                test.difference.low,
                test.difference.high,
                test.wins,
                test.ties,
                test.losses,
                test.p_adjusted,
                test.verdict,
            )
            if test is not None
            else (None,) * 7 + (NO_BASELINE,)
        ),
        None if arm.vs_full is None else arm.vs_full.value,
        arm.score.problems,
        arm.samples,
        len(test.excluded) if test is not None else 0,
    )
    return dict(zip(COLUMNS, values, strict=True))


def render(rows: list[dict], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
        return buffer.getvalue()
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(display_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


HEADER = (
    "model",
    "task",
    "runtime",
    "K",
    "K/N_avg",
    "policy",
    "score [95% CI]",
    "strict",
    "trunc / no-ans",
    "tokens",
    "Δ vs baseline [95% CI]",
    "W/T/L",
    "verdict",
    "Δ vs full",
)


def _number(value: float | None, fmt: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def display_cells(row: dict) -> list[str]:
    """The human-readable cells of one comparison row, in HEADER order (table and Markdown alike)."""
    budget = str(row["budget"]) if row["budget"] is not None else f"N_avg/{row['ratio']:g}"
    return [
        row["model"],
        row["task"],
        f"{row['runtime']} seed {row['seed']}",
        budget,
        _number(row["k_over_n_avg"], ".2f"),
        row["policy"],
        f"{row['score']:.3f} [{row['score_low']:.3f}, {row['score_high']:.3f}]",
        _number(row["strict"], ".3f"),
        f"{_number(row['truncation_rate'], '.0%')} / {_number(row['no_answer_rate'], '.0%')}",
        _number(row["mean_generated_tokens"], ".0f"),
        "—"
        if row["delta"] is None
        else f"{row['delta']:+.3f} [{row['delta_low']:+.3f}, {row['delta_high']:+.3f}]",
        "—" if row["wins"] is None else f"{row['wins']}/{row['ties']}/{row['losses']}",
        row["verdict"] if row["p_holm"] is None else f"{row['verdict']} (p={row['p_holm']:.3f})",
        _number(row["delta_full"], "+.3f"),
    ]

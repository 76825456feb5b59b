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
from typing import NamedTuple

import duckdb

from kvbench.errors import SpecError
from kvbench.runner.summary import CellSummary, most_complete, summarize
from kvbench.stats import Estimate, PairedComparison, bootstrap_mean, compare_arms, paired_difference, pool
from kvbench.stats import verdicts as holm_verdicts


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

_RUNS = (
    "SELECT run_id, model, task, protocol, adapter || '/' || device || '/' || dtype || '/' || attention, "
    "protocol_seed, samples_per_problem, budget, ratio, n_avg, policy, policy_params, role FROM runs "
    "WHERE (? IS NULL OR model = ?) AND (? IS NULL OR protocol = ?) "
    "ORDER BY created, run_id"
)


class _Run(NamedTuple):
    run_id: str
    model: str
    task: str
    protocol: str
    runtime: str
    """adapter/device/dtype/attention: arms are only ever paired within one runtime."""
    seed: int
    """The protocol seed: every sample's seed and eviction draws derive from it."""
    samples: int
    """Samples per problem."""
    budget: int | None
    ratio: float | None
    n_avg: float | None
    policy: str
    params: str
    role: str

    @property
    def arm(self) -> tuple[str, str]:
        return self.policy, self.params

    @property
    def context(self) -> tuple:
        """What a policy and its baseline must share to be paired: model, task, protocol, runtime, seed
        and samples per problem (the problems are matched by id)."""
        return self[1:7]


def compare(database: Path, filters: Filters) -> list[dict]:
    con = duckdb.connect(str(database), read_only=True)
    try:
        # every filter is a bound parameter: widget or CLI values never become SQL
        runs = [_Run(*r) for r in con.execute(_RUNS, [filters.model] * 2 + [filters.protocol] * 2).fetchall()]
        summaries = summarize(con, [r.run_id for r in runs])
    finally:
        con.close()
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
    # an arm run again with a larger --limit (a new run id) supersedes its smaller run
    runs = most_complete(runs, summaries, key=lambda r: r[1:])
    runs.sort(key=lambda r: (*r.context, r.budget or 0, r.policy, r.params))
    rows = _per_task(runs, summaries, filters)
    for name, tasks in filters.pools:
        if filters.task is None or filters.task in (name, *tasks):
            rows += _pooled(name, tasks, runs, summaries, filters)
    return rows


def _per_task(runs: list[_Run], summaries: dict[str, CellSummary], filters: Filters) -> list[dict]:
    runs = [r for r in runs if filters.task is None or r.task == filters.task]
    references = {r.context: r for r in runs if r.role == "reference"}
    rows: list[dict] = []
    for key in dict.fromkeys((r.context, r.budget) for r in runs if r.budget is not None):
        context, budget = key
        if filters.budget is not None and budget != filters.budget:
            continue
        group = [r for r in runs if (r.context, r.budget) == key]
        baseline = next((r for r in group if r.policy == filters.against), None)
        arms = [r for r in group if r is not baseline and r.role != "reference"]
        full = references.get(context)
        scores = {r.run_id: summaries[r.run_id].scores for r in group}
        tested: list[PairedComparison | None] = [None] * len(arms)
        if baseline is not None:  # never paired with another seed's, runtime's or sample count's null
            tested = holm_verdicts([compare_arms(scores[r.run_id], scores[baseline.run_id]) for r in arms])
        for run, test in zip(arms, tested, strict=True):
            vs_full = paired_difference(scores[run.run_id], summaries[full.run_id].scores) if full else None
            k_over_n = run.budget / run.n_avg if run.n_avg else math.nan
            rows.append(
                _row(context, budget, run.ratio, k_over_n, run, [summaries[run.run_id]], test, vs_full)
            )
    return rows


def _pooled(
    name: str, tasks: tuple[str, ...], runs: list[_Run], summaries: dict[str, CellSummary], filters: Filters
) -> list[dict]:
    """One table per (model, protocol, ratio or fixed K): arms that ran every task of the group, pooled."""
    members = [r for r in runs if r.task in tasks and r.role != "reference"]
    rows: list[dict] = []

    def shared(r: _Run) -> tuple:  # the pairing context without the task (samples are per task)
        return r.model, r.protocol, r.runtime, r.seed

    groups = dict.fromkeys((shared(r), r.ratio, None if r.ratio else r.budget) for r in members)
    for context, ratio, budget in groups:
        if filters.budget is not None and budget != filters.budget:
            continue
        here = [r for r in members if (shared(r), r.ratio) == (context, ratio)]
        here = [r for r in here if ratio is not None or r.budget == budget]
        complete: dict[tuple[str, str], dict[str, _Run]] = {}
        for arm in dict.fromkeys(r.arm for r in here):
            by_task = {r.task: r for r in here if r.arm == arm}
            if set(by_task) == set(tasks):
                complete[arm] = by_task
        baseline = next((arm for arm in complete if arm[0] == filters.against), None)
        if baseline is None:
            continue
        # an arm pairs with the baseline only where every task ran with the same samples per problem
        arms = [
            arm
            for arm in complete
            if arm != baseline
            and all(complete[arm][t].samples == complete[baseline][t].samples for t in tasks)
        ]
        if not arms:
            continue
        pooled = {
            arm: pool({task: summaries[run.run_id].scores for task, run in by_task.items()})
            for arm, by_task in complete.items()
        }
        fulls = {r.task: r for r in runs if r.role == "reference" and shared(r) == context}
        full = (
            pool({t: summaries[fulls[t].run_id].scores for t in tasks}) if set(tasks) <= set(fulls) else None
        )
        tested = holm_verdicts([compare_arms(pooled[arm], pooled[baseline]) for arm in arms])
        for arm, test in zip(arms, tested, strict=True):
            parts = list(complete[arm].values())
            vs_full = paired_difference(pooled[arm], full) if full else None
            k_over_n = [r.budget / r.n_avg for r in parts if r.n_avg]
            model, protocol, runtime, seed = context
            row = _row(
                (model, name, protocol, runtime, seed, None),
                budget,
                ratio,
                1 / ratio if ratio else sum(k_over_n) / len(k_over_n) if k_over_n else math.nan,
                parts[0],
                [summaries[r.run_id] for r in parts],
                test,
                vs_full,
                pooled_scores=pooled[arm],
            )
            rows.append(row)
    return rows


def _row(
    key: tuple,
    budget: int | None,
    ratio: float | None,
    k_over_n_avg: float,
    run: _Run,
    parts: list[CellSummary],
    test: PairedComparison | None,
    vs_full: Estimate | None,
    pooled_scores: dict | None = None,
) -> dict:
    """One comparison row; ``test`` is None when no baseline of the same context was stored."""
    scores = pooled_scores if pooled_scores is not None else parts[0].scores
    strict = pool({str(i): p.strict for i, p in enumerate(parts)})
    samples = sum(p.samples for p in parts)

    def rate(field: str) -> float:
        return sum(getattr(p, field) * p.samples for p in parts) / samples if samples else math.nan

    score = bootstrap_mean(list(scores.values()))
    values = (
        *key,
        budget,
        ratio,
        k_over_n_avg,
        run.policy,
        run.params,
        score.value,
        score.low,
        score.high,
        bootstrap_mean(list(strict.values())).value,
        rate("truncation_rate"),
        rate("no_answer_rate"),
        rate("mean_generated_tokens"),
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
        None if vs_full is None else vs_full.value,
        score.problems,
        samples,
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


NO_BASELINE = "no matching baseline"
"""The verdict of a policy whose baseline was not run under the same protocol seed, runtime and samples
per problem: it is shown, never paired with another baseline."""

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

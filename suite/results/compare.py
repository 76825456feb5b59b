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
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from kvbench.errors import SpecError
from kvbench.printable import spreadsheet_cell
from kvbench.results.comparison import (
    NO_BASELINE,
    ArmResult,
    StoredRun,
    compare_table,
    judged_together,
    stored_runs,
    task_metrics,
)
from kvbench.results.stats import MAX_PROBLEMS, POWER, Estimate, PowerPlan
from kvbench.results.summary import CellSummary, summarize
from kvbench.specs.metric_kind import refuse_mixed_pool
from kvbench.specs.protocol import NULL_POLICY
from kvbench.specs.resolved import Role
from kvbench.store.ingest import reading


@dataclass(frozen=True)
class Filters:
    model: str | None = None
    task: str | None = None
    protocol: str | None = None
    budget: int | None = None
    against: str = NULL_POLICY
    pools: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Declared task groups, (name, tasks): each also compared pooled, when every task has the arms."""
    seed: int | None = None
    """Only runs under this protocol seed (``kvbench run``'s own tables)."""
    quantity: str = "score"
    """What arms are ranked and paired by: a name in kvbench.results.summary.QUANTITIES."""
    family: str = "table"
    """What each Holm correction runs over (`kvbench compare --family`): ``table``, the policies of one
    table (one task at one budget, or one pooled table); ``sweep``, every table of one model, protocol,
    runtime, seed and source across tasks and budgets (pooled tables a family of their own). Filters
    (--task, --budget) never change a family: a sweep's is formed before they choose the rows shown."""


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
    "lengthening",
    "tokens_per_correct",
    "delta_tokens",
    "delta_tokens_low",
    "delta_tokens_high",
    "delta_truncation",
    "delta_truncation_low",
    "delta_truncation_high",
    "delta_tokens_per_correct",
    "delta",
    "delta_low",
    "delta_high",
    "wins",
    "ties",
    "losses",
    "p_sign",
    "p_mean",
    "method",
    "p_holm",
    "verdict",
    "margin",
    "margin_from",
    "p_equivalence_holm",
    "minimum_detectable_effect",
    "problems_needed",
    "problems_needed_for",
    "family",
    "family_size",
    "delta_full",
    "problems",
    "samples",
    "excluded",
    "submission",
)
"""``submission``: the sha256 of the bundle whose runs a row compares, on a board; empty for one's own
runs. ``p_sign``: the sign test; ``p_mean``: the test of the mean difference that the Δ interval inverts
(``method``: exact or bootstrap-t); ``p_holm``: the larger of the two, Holm-corrected over ``family``
(``family_size`` comparisons); ``margin``: the equivalence margin in the metric's units, and
``margin_from`` the spec field that declared it."""


def compare(database: Path, filters: Filters) -> list[dict]:
    with reading(database) as con:  # an empty or damaged file is named, with how to rebuild it
        # every filter is a bound parameter: widget or CLI values never become SQL
        runs = stored_runs(con, model=filters.model, protocol=filters.protocol)
        summaries = summarize(con, [r.run_id for r in runs], filters.quantity)
    runs = [r for r in runs if filters.seed is None or r.seed == filters.seed]
    metrics = task_metrics(runs, filters.quantity)
    for name, tasks in filters.pools:
        missing = [t for t in tasks if t not in metrics]
        if missing:
            raise SpecError(
                f"pool {name!r}: no stored runs of task(s) {', '.join(missing)}"
                + (f" for model {filters.model!r}" if filters.model else "")
                + f"; tasks with stored runs: {', '.join(sorted(metrics)) or 'none'}"
            )
        refuse_mixed_pool(f"--pool {name}={','.join(tasks)}", {t: metrics[t] for t in tasks})
    sweep = filters.family == "sweep"  # a sweep's family spans every task: none filtered out first
    tables = task_tables(
        [r for r in runs if sweep or filters.task in (None, r.task)],
        summaries,
        filters.against,
        filters.quantity,
    )
    pooled = [
        table
        for name, tasks in filters.pools
        if sweep or filters.task in (None, name, *tasks)
        for table in pooled_tables(name, tasks, runs, summaries, filters)
    ]
    if sweep:
        tables, pooled = sweep_families(tables), sweep_families(pooled)
    rows = []
    for table in [*tables, *pooled]:
        if filters.budget is not None and table.budget != filters.budget:
            continue
        if filters.task not in (None, *table.members, table.context[1]):
            continue
        pooled_row = len(table.members) > 1
        # the arms a comparison lists (neither the baseline nor the full cache), by policy and parameters
        shown = [a for a in table.arms if a.role != Role.REFERENCE and a.policy != filters.against]
        rows += [
            arm_row(table.context, table.budget, table.ratio, arm, pooled=pooled_row)
            for arm in sorted(shown, key=lambda a: (a.policy, a.params))
        ]
    return rows


def _tables(runs: list[StoredRun], key) -> dict[tuple, list[StoredRun]]:
    """The non-reference runs grouped by ``key`` (tables ordered by context, budget and policy; each
    table's runs kept in creation order, which decides which of two equal runs stands for an arm)."""
    members = [r for r in runs if r.role != Role.REFERENCE]
    ordered = sorted(members, key=lambda r: (r.context, r.budget or 0, r.policy, r.params))
    return {table: [r for r in members if key(r) == table] for table in dict.fromkeys(map(key, ordered))}


@dataclass(frozen=True)
class TaskTable:
    """One table of `kvbench compare`'s default: the arms of one task at one budget, Holm-corrected
    together. The leaderboard's per-task verdicts are these tables', so the two say the same."""

    context: tuple[str, str, str, str, int, str]
    """(model, task, protocol, runtime, seed, source); for a pooled table the pool's name is the task."""
    budget: int | None
    ratio: float | None
    arms: list[ArmResult]
    """Every arm of the table, the baseline and the full cache included."""
    members: tuple[str, ...] = ()
    """The tasks of a pooled table (empty: one task's table)."""


def task_tables(
    runs: list[StoredRun], summaries: dict[str, CellSummary], against: str, quantity: str = "score"
) -> list[TaskTable]:
    """Every (model, task, protocol, runtime, seed, budget) table of ``runs``, each compared against the
    arm of policy ``against`` on ``quantity`` (what ``summaries`` hold)."""
    tables = []
    for (context, budget), members in _tables(runs, key=lambda r: (r.context, r.budget)).items():
        references = [r for r in runs if r.role == Role.REFERENCE and r.context == context]
        arms = compare_table(
            members + references, summaries, tasks=(context[1],), baseline=against, quantity=quantity
        )
        tables.append(TaskTable(context, budget, members[0].ratio, arms))
    return tables


def pooled_tables(
    name: str,
    tasks: tuple[str, ...],
    runs: list[StoredRun],
    summaries: dict[str, CellSummary],
    filters: Filters,
) -> list[TaskTable]:
    """One table per (model, protocol, runtime, seed, ratio or fixed K): arms that ran every task, pooled."""

    def shared(r: StoredRun) -> tuple:  # the pairing context without the task
        return r.model, r.protocol, r.runtime, r.seed, r.source

    members = [r for r in runs if r.task in tasks]
    tables = []
    for (context, ratio, budget), group in _tables(
        members, key=lambda r: (shared(r), r.ratio, None if r.ratio else r.budget)
    ).items():
        references = [r for r in members if r.role == Role.REFERENCE and shared(r) == context]
        arms = compare_table(
            group + references, summaries, tasks=tasks, baseline=filters.against, quantity=filters.quantity
        )
        if not any(a.policy == filters.against and a.role != Role.REFERENCE for a in arms):
            continue
        model, protocol, runtime, seed, source = context
        tables.append(TaskTable((model, name, protocol, runtime, seed, source), budget, ratio, arms, tasks))
    return tables


def sweep_families(tables: list[TaskTable]) -> list[TaskTable]:
    """``tables`` with their tests Holm-corrected as one family per (model, protocol, runtime, seed,
    source): every task and budget of a sweep together (pooled tables are passed apart, and so form their
    own family)."""

    def sweep(table: TaskTable) -> tuple:
        model, _, protocol, runtime, seed, source = table.context
        return model, protocol, runtime, seed, source

    groups: dict[tuple, list[int]] = {}
    for index, table in enumerate(tables):
        groups.setdefault(sweep(table), []).append(index)
    out = list(tables)
    for (model, protocol, runtime, seed, _), indices in groups.items():
        kind = "pooled table" if tables[indices[0]].members else "task × budget table"
        family = f"every {kind} of {model} · {protocol} · {runtime} seed {seed} ({len(indices)} tables)"
        judged = judged_together([tables[i].arms for i in indices], family)
        for i, arms in zip(indices, judged, strict=True):
            out[i] = replace(tables[i], arms=arms)
    return out


def arm_row(key: tuple, budget: int | None, ratio: float | None, arm: ArmResult, *, pooled: bool) -> dict:
    """One comparison row of COLUMNS from the builder's result; ``key`` is (model, task, protocol, runtime,
    seed). `kvbench run`'s table is made of these rows too, with each arm's role beside them."""
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
        arm.lengthening,
        arm.tokens_per_correct,
        *_interval(arm.tokens_vs_baseline),
        *_interval(arm.truncation_vs_baseline),
        arm.tokens_per_correct_vs_baseline,
        *_interval(arm.vs_baseline),  # the test's difference; for the full cache, its paired difference
        *(
            (
                test.wins,
                test.ties,
                test.losses,
                test.p_value,
                test.p_mean,
                test.method,
                test.p_adjusted,
                test.verdict,
                test.margin,
                test.margin_from,
                test.p_equivalence_adjusted,
                test.minimum_detectable,
                test.problems_needed,
                test.plan.decision if test.plan else None,
                test.family,
                test.family_size,
            )
            if test is not None
            else (None,) * 7 + (NO_BASELINE,) + (None,) * 8
        ),
        None if arm.vs_full is None else arm.vs_full.value,
        arm.score.problems,
        arm.samples,
        len(test.excluded) if test is not None else 0,
        arm.source,
    )
    return dict(zip(COLUMNS, values, strict=True))


def _interval(estimate: Estimate | None) -> tuple[float | None, float | None, float | None]:
    return (None, None, None) if estimate is None else (estimate.value, estimate.low, estimate.high)


def render(rows: list[dict], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({key: spreadsheet_cell(value) for key, value in row.items()} for row in rows)
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
    "tokens (× full) / per correct",
    "Δ tokens [95% CI] / Δ trunc vs baseline",
    "Δ vs baseline [95% CI]",
    "W/T/L",
    "verdict",
    "margin / MDE",
    "Δ vs full",
)


def _number(value: float | None, fmt: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def display_cells(row: dict) -> list[str]:
    """The human-readable cells of one comparison row, in HEADER order (table and Markdown alike)."""
    budget, ratio = row["budget"], row["ratio"]  # neither for the full cache of `kvbench run`'s table
    return [
        row["model"],
        row["task"],
        f"{row['runtime']} seed {row['seed']}",
        str(budget) if budget is not None else "—" if ratio is None else f"N_avg/{ratio:g}",
        _number(row["k_over_n_avg"], ".2f"),
        arm_name(row),
        f"{row['score']:.3f} [{row['score_low']:.3f}, {row['score_high']:.3f}]",
        _number(row["strict"], ".3f"),
        f"{_number(row['truncation_rate'], '.0%')} / {_number(row['no_answer_rate'], '.0%')}",
        f"{_number(row['mean_generated_tokens'], '.0f')} ({_number(row['lengthening'], '.2f')}×) / "
        f"{_number(row['tokens_per_correct'], '.0f')} ({_number(row['delta_tokens_per_correct'], '+.0f')})",
        f"{_signed_interval(row, 'delta_tokens', '.0f')} / {_number(row['delta_truncation'], '+.0%')}",
        delta_cell(row, interval=True),
        "—" if row["wins"] is None else f"{row['wins']}/{row['ties']}/{row['losses']}",
        verdict_text(row),
        "—"
        if row["margin"] is None
        else f"{margin_text(row['margin'])} / {effect_text(row['minimum_detectable_effect'])}",
        _number(row["delta_full"], "+.3f"),
    ]


def _signed_interval(row: dict, name: str, fmt: str) -> str:
    value, low, high = (row[name], row[f"{name}_low"], row[f"{name}_high"])
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:+{fmt}} [{low:+{fmt}}, {high:+{fmt}}]"


COMPACT_HEADER = ("policy", "K/N_avg", "score ± CI", "Δ ± CI", "verdict (Holm p)", "problems")
"""The table a terminal shows by default, readable at 100 columns: one model and task per table, the
baseline named in its title, problems as "problems × samples"; ``--wide`` shows every column of HEADER."""


def compact_cells(row: dict) -> list[str]:
    """One comparison row in COMPACT_HEADER's columns; an interval as value ± its half-width."""
    return [
        arm_name(row),
        _number(row["k_over_n_avg"], ".2f"),
        plus_minus(row["score"], row["score_low"], row["score_high"]),
        delta_cell(row),
        compact_verdict(row["verdict"], row["p_holm"], inside=inside_margin(row)),
        f"{row['problems']} × {row['samples_per_problem'] or '—'}",
    ]


def arm_name(row: dict) -> str:
    """The policy, and beside a null or full-cache row of `kvbench run`'s table its role; on a board, the
    submission it came from (its bundle's first 8 hex digits)."""
    role = row.get("role", Role.POLICY)
    name = row["policy"] if role == Role.POLICY else f"{row['policy']} ({role})"
    return f"{name} @{row['submission'][:8]}" if row.get("submission") else name


def plus_minus(value: float | None, low: float | None, high: float | None, *, signed: bool = False) -> str:
    if value is None or low is None or high is None or math.isnan(value):
        return "—"
    return f"{value:{'+' if signed else ''}.3f} ± {(high - low) / 2:.3f}"


def compact_verdict(verdict: str | None, p_holm: float | None, *, inside: bool = False) -> str:
    """A tested verdict by its first word ("beats", "loses", "practically", "equivalent",
    "inconclusive") and Holm p; a *beats* or *loses* whose Δ lies inside the margin says so."""
    if p_holm is None or verdict is None:
        return verdict or "—"
    word = {"practically equivalent": "practically-equivalent"}.get(verdict, verdict.split()[0])
    return f"{word}{INSIDE if inside else ''} p={p_holm:.3f}"


INSIDE = " (Δ inside margin)"
"""Beside a *beats* or *loses* whose mean difference lies inside ±margin while too few problems show
equivalence: the difference is real, its size may not matter."""
NO_PROBLEM_DIFFERS = "no problem differs"


def inside_margin(row: dict) -> bool:
    """A decided difference whose mean lies inside ±margin (equivalence not shown)."""
    margin, delta = row.get("margin"), row.get("delta")
    if row.get("verdict") not in ("beats null", "loses to null") or margin is None or delta is None:
        return False
    return not math.isnan(margin) and abs(delta) < margin


def delta_cell(row: dict, *, interval: bool = False) -> str:
    """Δ ± half its 95% interval (``interval``: Δ [low, high]); where no problem differs, that instead of
    a zero-width interval."""
    if row.get("wins") == 0 and row.get("losses") == 0:
        return f"{row['delta']:+.3f} ({NO_PROBLEM_DIFFERS})"
    if interval:
        return _signed_interval(row, "delta", ".3f")
    return plus_minus(row["delta"], row["delta_low"], row["delta_high"], signed=True)


NO_DIFFERENCE = "no arm differs on any problem at this K: more problems of this probe cannot separate them"
"""Where no policy of a table differs from the null on any problem: no count of problems is shown."""

_TO = {"beats null": "to beat", "loses to null": "to lose", "equivalent to null": "to be equivalent"}


def needed_text(plan: PowerPlan | None, *, differs: bool, margin: float | None, short: bool = False) -> str:
    """What an *inconclusive* comparison would need: the problems that give a decision (named) 80% power
    at the observed differences (stats.plan_decision), or why no number of problems decides. ``differs``:
    whether the arms differ on any problem; ``short``: for a table cell."""
    if plan is None or margin is None or math.isnan(margin):
        return "no margin" if short else "no equivalence margin to plan with"
    if plan.decision is not None:
        count = f"over {MAX_PROBLEMS:,}" if plan.problems is None else str(plan.problems)
        if short:
            return f"{count} problems {_TO[plan.decision]}"
        return f"{count} problems would give {POWER:.0%} power to decide {plan.decision!r}"
    if not differs:
        return "no problem differs" if short else f"no problem differs from the null at this K: {_CANNOT}"
    if short:
        return "no count decides"
    return (
        f"wins as many problems as it loses, yet its mean differs by more than ±{margin:g}: "
        "no number of problems decides at these differences"
    )


_CANNOT = "more problems of this probe cannot separate them"


def row_needs(row: dict, *, short: bool = False) -> str:
    """needed_text for a comparison row (its problems_needed and problems_needed_for columns)."""
    plan = PowerPlan(row["problems_needed_for"], row["problems_needed"])
    return needed_text(plan, differs=bool(row["wins"] or row["losses"]), margin=row["margin"], short=short)


def power_notes(rows: list[dict]) -> list[str]:
    """Under the compact table: what each *inconclusive* arm would need (``--wide`` puts it in a cell);
    one line where no arm of the table differs from the null on any problem."""
    tested = [r for r in rows if r["wins"] is not None]
    waiting = [r for r in tested if r["verdict"] == "inconclusive"]
    notes = holm_families((r["family"], r["family_size"]) for r in tested if r.get("family"))
    # which equivalence margin the rows used and which spec field declared it, once per margin
    margins = dict.fromkeys((r.get("margin"), r.get("margin_from")) for r in tested if r.get("margin_from"))
    notes += [f"equivalence margin {margin_text(margin)}: {where}" for margin, where in margins]
    if waiting and all(r["wins"] == r["losses"] == 0 for r in tested):
        return [*notes, NO_DIFFERENCE]
    return [*notes, *(f"{r['policy']}: inconclusive; {row_needs(r)}" for r in waiting)]


def holm_families(families: Iterable[tuple[str, int]]) -> list[str]:
    """One line per (family, size), in order, each once: what a Holm correction ran over."""
    return [
        f"Holm over {size} comparison{'s' * (size != 1)}: {family}"
        for family, size in dict.fromkeys(families)
    ]


def margin_text(margin: float | None) -> str:
    """±margin in the metric's units; "none" where the metric has none (no equivalence test)."""
    return "none" if margin is None or math.isnan(margin) else f"±{margin:g}"


def verdict_text(row: dict) -> str:
    """A verdict as people read it: with the sign test's Holm p, and beside *inconclusive* what would
    decide it at the observed differences."""
    verdict, p_holm = row["verdict"], row["p_holm"]
    if p_holm is None:
        return verdict or "—"
    text = f"{verdict}{INSIDE if inside_margin(row) else ''} (p={p_holm:.3f})"
    if verdict == "inconclusive":
        text += f"; {POWER:.0%} power: {row_needs(row, short=True)}"
    return text


def effect_text(effect: float | None) -> str:
    """The minimum detectable effect: "none" where no effect is detectable with these problems."""
    if effect is None or math.isnan(effect):
        return "—"
    return "none" if math.isinf(effect) else f"{effect:.3f}"

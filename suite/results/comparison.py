"""The comparison every results table shows, built in one place: `kvbench run`'s table, `kvbench compare`
and the leaderboard all call :func:`compare_table` and only format what it returns.

A table is a set of stored runs that share model, protocol, runtime, protocol seed and compression
(the full cache's runs serve every compression). Within it, an *arm* is a policy with its parameters and
role, from one source: one's own runs, or one submission on a board (kvbench.store.board_tables); each
arm's score pools the table's tasks, clustered by (task, problem). Every arm is paired with the baseline
(the Random Attention null unless asked otherwise) of its own source only, where both ran the same
samples per problem on every task: a submission's policy meets its own null and full cache (the same
machine, the same seeds), never another group's. The sign tests of one source's paired arms are
Holm-corrected together, so that a later submission never changes an earlier one's verdicts. An arm
whose baseline is missing or differs in samples is reported as such, never paired with another.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import duckdb

from kvbench.results.pairing import pairs, partner
from kvbench.results.stats import (
    Estimate,
    PairedComparison,
    bootstrap_mean,
    compare_arms,
    paired_difference,
    pool,
)
from kvbench.results.stats import verdicts as holm_verdicts
from kvbench.results.summary import QUANTITIES, CellSummary, most_complete
from kvbench.specs.metric_kind import Margin, Metric, equivalence_margin, task_metric
from kvbench.specs.protocol import NULL_POLICY
from kvbench.specs.resolved import ResolvedSpec, Role
from kvbench.store.board_tables import counted_runs

RUNTIME = "adapter || '/' || device || '/' || dtype || '/' || attention"
"""A run's runtime as one label: arms are compared within one runtime, never across two."""

NO_BASELINE = "no matching baseline"
"""The verdict of an arm whose baseline was not run under the same protocol seed, runtime and samples
per problem: it is shown, never paired with another baseline."""


Arm = tuple[str, str, Role, str]
"""(policy, parameters, role, source)."""


class StoredRun(NamedTuple):
    """One row of the runs table, as the comparison reads it."""

    run_id: str
    model: str
    task: str
    protocol: str
    runtime: str
    """adapter/device/dtype/attention."""
    seed: int
    """The protocol seed: every sample's seed and eviction draws derive from it."""
    samples: int
    """Samples per problem."""
    budget: int | None
    ratio: float | None
    n_avg: float | None
    policy: str
    params: str
    role: Role
    source: str
    """The sha256 of the submission that brought the run to a board; LOCAL_SOURCE for one's own runs."""
    spec: ResolvedSpec
    """The resolved spec: what pairs a run with its null and its full cache (kvbench.results.pairing)."""

    @property
    def arm(self) -> Arm:
        return self.policy, self.params, self.role, self.source

    @property
    def context(self) -> tuple[str, str, str, str, int, str]:
        """What every run of one table shares (the task aside): model, task, protocol, runtime, seed and
        source."""
        return self.model, self.task, self.protocol, self.runtime, self.seed, self.source


_RUNS = f"""
SELECT run_id, model, task, protocol, {RUNTIME}, protocol_seed, samples_per_problem, budget, ratio, n_avg,
       policy, policy_params, role, source, spec
FROM {{runs}} runs
WHERE (? IS NULL OR list_contains(?, run_id)) AND (? IS NULL OR model = ?) AND (? IS NULL OR protocol = ?)
ORDER BY created, run_id
"""


def stored_runs(
    con: duckdb.DuckDBPyConnection,
    *,
    run_ids: Sequence[str] | None = None,
    model: str | None = None,
    protocol: str | None = None,
) -> list[StoredRun]:
    """Runs in the order they were created; every filter is a bound parameter."""
    ids = None if run_ids is None else list(run_ids)
    query = _RUNS.format(runs=counted_runs(con))
    rows = con.execute(query, [ids, ids, model, model, protocol, protocol]).fetchall()
    return [
        StoredRun._make([*fields, Role(role), source, ResolvedSpec.read(json.loads(spec), Role(role))])
        for *fields, role, source, spec in rows
    ]


def common_tasks(runs: Sequence[StoredRun]) -> list[str]:
    """The tasks every arm of a table ran, sorted: what its pooled scores can fairly average."""
    ran: dict[Arm, set[str]] = {}
    for run in runs:
        ran.setdefault(run.arm, set()).add(run.task)
    return sorted(set.intersection(*ran.values())) if ran else []


def task_metrics(runs: Sequence[StoredRun], quantity: str = "score") -> dict[str, Metric]:
    """Task -> the metric its problem scores under ``quantity`` are means of (kvbench.specs.metric_kind):
    what decides which tasks a score may pool."""
    return {run.task: task_metric(run.spec.task, QUANTITIES[quantity]) for run in runs}


def k_over_n_avg(runs: Sequence[StoredRun]) -> float:
    """The budget as a share of the tasks' reference length: the mean of K / N_avg over the runs that have
    both (a ratio protocol's K is N_avg / ratio rounded to its buffer, so this is what was used)."""
    shares = [r.budget / r.n_avg for r in runs if r.budget and r.n_avg and r.role != Role.REFERENCE]
    return sum(shares) / len(shares) if shares else math.nan


@dataclass(frozen=True)
class ArmResult:
    """One arm of a table: its score pooled over the table's tasks, and how it compares."""

    policy: str
    params: str
    role: Role
    source: str
    """The submission whose runs these are (LOCAL_SOURCE for one's own)."""
    runs: dict[str, StoredRun]
    """Task -> the run standing for this arm on it (the one with the most samples), pooled or not."""
    per_task: dict[str, Estimate]
    score: Estimate
    """Pooled over the table's tasks, clustered by (task, problem)."""
    strict: Estimate
    """Strict pass@1: correct and finished before the token cap."""
    truncation_rate: float
    no_answer_rate: float
    mean_generated_tokens: float
    k_over_n_avg: float
    samples: int
    """Sample rows behind the pooled score."""
    vs_baseline: Estimate | None
    """Paired difference to the baseline (None for the baseline itself, or without a matching one)."""
    test: PairedComparison | None
    """The sign test against the baseline with its Holm-corrected verdict (arms under test only)."""
    vs_full: Estimate | None
    lengthening: float = math.nan
    """Mean generated tokens over those of the full cache on the same problems (1: as long; NaN: no
    paired full cache, or a task that generates nothing)."""
    tokens_per_correct: float = math.nan
    """Generated tokens over correct samples (NaN without a correct/incorrect verdict or a correct one)."""
    tokens_vs_baseline: Estimate | None = None
    """Paired per-problem difference of mean generated tokens to the baseline."""
    truncation_vs_baseline: Estimate | None = None
    """Paired per-problem difference of the share of samples stopped by the token cap."""
    tokens_per_correct_vs_baseline: float = math.nan
    """This arm's tokens per correct answer minus the baseline's, on the paired runs."""

    @property
    def verdict(self) -> str | None:
        """The Holm verdict, NO_BASELINE for an arm under test that could not be paired, None otherwise."""
        if self.test is not None:
            return self.test.verdict
        return NO_BASELINE if self.role == Role.POLICY else None


def _rate(parts: Sequence[CellSummary], field: str) -> float:
    samples = sum(p.samples for p in parts)
    return sum(getattr(p, field) * p.samples for p in parts if p.samples) / samples if samples else math.nan


def _tokens_per_correct(parts: Sequence[CellSummary]) -> float:
    if any(p.correct is None for p in parts) or not (correct := sum(p.correct or 0 for p in parts)):
        return math.nan
    return sum(p.mean_generated_tokens * p.samples for p in parts) / correct


def _ratio_of_means(arm: Mapping[Any, float], other: Mapping[Any, float]) -> float:
    """Mean of ``arm`` over mean of ``other``, on the problems both have (NaN without any, or a 0)."""
    shared = set(arm) & set(other)
    below = sum(other[k] for k in shared)
    return sum(arm[k] for k in shared) / below if shared and below else math.nan


def compare_table(
    runs: Sequence[StoredRun],
    summaries: Mapping[str, CellSummary],
    *,
    tasks: Sequence[str],
    also: Sequence[str] = (),
    baseline: str = NULL_POLICY,
    quantity: str = "score",
) -> list[ArmResult]:
    """Every arm of one table, pooled over ``tasks`` (arms that miss one of them are left out).

    ``runs`` are one table's runs in creation order; an arm run again on a task (say with a larger
    --limit) is represented by its run with the most samples. The baseline is the arm of policy
    ``baseline`` that is not the full-cache reference (its null run, if it also ran as a policy).
    Tasks in ``also`` are not pooled, but an arm's runs and per-task scores on them are reported.
    Each source's runs (one's own, each submission's) are compared apart, in the order they come.
    ``quantity`` is what ``summaries`` hold (kvbench.results.summary.QUANTITIES): it picks the margin.
    The tests are Holm-corrected across the table's policies (table_family); judged_together corrects
    several tables as one family instead.
    """
    arms = []
    for source in dict.fromkeys(run.source for run in runs):
        table = _Source([r for r in runs if r.source == source], summaries, tasks, baseline)
        tests = table.tests(QUANTITIES[quantity])
        arms += [table.result(arm, tests.get(arm), also) for arm in table.arms]
    return arms


def table_family(runs: Sequence[StoredRun], tasks: Sequence[str], baseline: str) -> str:
    """How a table's Holm family reads under it: its policies, task or pool, and budget."""
    budgets = {r.budget for r in runs if r.role != Role.REFERENCE}
    ratios = {r.ratio for r in runs if r.role != Role.REFERENCE}
    at = ""
    if len(tasks) == 1 and len(budgets) == 1 and None not in budgets:
        at = f" at K={budgets.pop()}"
    elif len(ratios) == 1 and None not in ratios:
        at = f" at N_avg/{ratios.pop():g}"
    if len(tasks) == 1:
        return f"the policies of the {tasks[0]} table{at}, against {baseline}"
    return (
        f"the policies of the pooled {' + '.join(tasks)} table{at}, against {baseline} "
        "(a pooled table is a family apart: its per-task rows are not in it)"
    )


def judged_together(tables: Sequence[Sequence[ArmResult]], family: str) -> list[list[ArmResult]]:
    """The arms of several tables, every test among them Holm-corrected as one ``family`` (a sweep's
    tables together) instead of table by table; what the tests read (their raw p-values) is kept."""
    judged = iter(
        holm_verdicts([a.test for table in tables for a in table if a.test is not None], family=family)
    )
    return [[replace(a, test=next(judged)) if a.test is not None else a for a in table] for table in tables]


Scores = dict[tuple[str, str], float]
"""Per problem (task, problem id) of a table's tasks pooled: one arm's score or another measure."""


class _Source:
    """One source's arms with every task of a table, each paired with the null's and the full cache's
    runs it is compared against (section 9's pairing rule)."""

    def __init__(
        self,
        runs: Sequence[StoredRun],
        summaries: Mapping[str, CellSummary],
        tasks: Sequence[str],
        baseline: str,
    ) -> None:
        self.runs, self.summaries, self.tasks, self.baseline = runs, summaries, tasks, baseline
        chosen = most_complete(list(runs), summaries, key=lambda r: (r.task, *r.arm))
        by_arm: dict[Arm, dict[str, StoredRun]] = {}
        for run in chosen:
            by_arm.setdefault(run.arm, {})[run.task] = run
        arms = {arm: got for arm, got in by_arm.items() if all(t in got for t in tasks)}
        self.every: dict[tuple[Arm, str], list[StoredRun]] = {}  # all of an arm's runs on a task, to pair
        for run in runs:
            self.every.setdefault((run.arm, run.task), []).append(run)
        candidates = [a for a in arms if a[0] == baseline and a[2] != Role.REFERENCE]
        self.base = next((a for a in candidates if a[2] == Role.NULL), candidates[0] if candidates else None)
        self.full = next((a for a in arms if a[2] == Role.REFERENCE), None)
        if self.full is not None and self.base is not None:  # the full cache that pairs with the null
            paired = {t: _partner(arms[self.base][t], self.every, self.full, Role.REFERENCE) for t in tasks}
            arms[self.full] = {**arms[self.full], **{t: run for t, run in paired.items() if run is not None}}
        self.arms = arms
        self.pooled = {arm: self.own(arm, "scores") for arm in arms}
        self.nulls = {arm: self.partner_runs(arm, self.base, Role.NULL) for arm in arms}
        self.fulls = {arm: self.partner_runs(arm, self.full, Role.REFERENCE) for arm in arms}

    def own(self, arm: Arm, field: str) -> Scores:
        return pool({t: getattr(self.summaries[self.arms[arm][t].run_id], field) for t in self.tasks})

    def partner_runs(self, arm: Arm, other: Arm | None, role: Role) -> dict[str, StoredRun]:
        """Task -> the other arm's run that pairs with this arm's; empty unless every task has one."""
        arms, tasks = self.arms, self.tasks
        if other is None or other == arm:
            return {}
        if arm[2] == Role.REFERENCE:  # the full cache against the null: the null's runs that pair with it
            found = {
                t: arms[other][t]
                for t in tasks
                if pairs(arms[other][t].spec, arms[arm][t].spec, Role.REFERENCE)
            }
        else:
            found = {
                t: run for t in tasks if (run := _partner(arms[arm][t], self.every, other, role)) is not None
            }
        return found if len(found) == len(tasks) else {}

    def scores(
        self, found: dict[str, StoredRun], field: str = "scores"
    ) -> dict[tuple[str, str], float] | None:
        """The runs' per-problem ``field`` (a CellSummary's per-problem mapping), pooled over tasks."""
        if not found:
            return None
        return pool({t: getattr(self.summaries[run.run_id], field) for t, run in found.items()})

    def tests(self, column: str) -> dict[Arm, PairedComparison]:
        """Every policy against its null, Holm-corrected as the table's family."""
        tested = [a for a in self.arms if a != self.base and a[2] != Role.REFERENCE and self.nulls[a]]
        margins = {a: table_margin([self.arms[a][t] for t in self.tasks], column) for a in tested}
        family = [
            replace(
                compare_arms(self.pooled[a], self.scores(self.nulls[a]) or {}, margins[a].value),
                margin_from=margins[a].declared_by,
            )
            for a in tested
        ]
        judged = holm_verdicts(family, family=table_family(self.runs, self.tasks, self.baseline))
        return dict(zip(tested, judged, strict=True))

    def result(self, arm: Arm, test: PairedComparison | None, also: Sequence[str]) -> ArmResult:
        """One arm's row: its scores, and its differences from the null and the full cache."""
        got, summaries, tasks, pooled = self.arms[arm], self.summaries, self.tasks, self.pooled[arm]
        parts = [summaries[got[t].run_id] for t in tasks]
        base_scores, full_scores = self.scores(self.nulls[arm]), self.scores(self.fulls[arm])
        if test is not None:
            vs_base = test.difference
        elif arm[2] == Role.REFERENCE and base_scores is not None:
            vs_base = paired_difference(pooled, base_scores, bounded=None)
        else:
            vs_base = None
        shown = [t for t in dict.fromkeys((*tasks, *also)) if t in got]
        tokens, null_tokens = self.own(arm, "tokens"), self.scores(self.nulls[arm], "tokens")
        null_truncated = self.scores(self.nulls[arm], "truncated")
        full_tokens = tokens if arm[2] == Role.REFERENCE else self.scores(self.fulls[arm], "tokens")
        per_correct = _tokens_per_correct(parts)
        null_parts = [summaries[run.run_id] for run in self.nulls[arm].values()]
        return ArmResult(
            policy=arm[0],
            params=arm[1],
            role=arm[2],
            source=arm[3],
            runs={t: got[t] for t in shown},
            per_task={t: bootstrap_mean(list(summaries[got[t].run_id].scores.values())) for t in shown},
            score=bootstrap_mean(list(pooled.values())),
            strict=bootstrap_mean(list(self.own(arm, "strict").values())),
            truncation_rate=_rate(parts, "truncation_rate"),
            no_answer_rate=_rate(parts, "no_answer_rate"),
            mean_generated_tokens=_rate(parts, "mean_generated_tokens"),
            k_over_n_avg=k_over_n_avg([got[t] for t in tasks]),
            samples=sum(p.samples for p in parts),
            vs_baseline=vs_base,
            test=test,
            vs_full=paired_difference(pooled, full_scores, bounded=None) if full_scores is not None else None,
            lengthening=_ratio_of_means(tokens, full_tokens or {}),
            tokens_per_correct=per_correct,
            tokens_vs_baseline=paired_difference(tokens, null_tokens) if null_tokens else None,
            truncation_vs_baseline=(
                paired_difference(self.own(arm, "truncated"), null_truncated) if null_truncated else None
            ),
            tokens_per_correct_vs_baseline=(
                per_correct - _tokens_per_correct(null_parts) if null_parts else math.nan
            ),
        )


def table_margin(runs: Sequence[StoredRun], column: str) -> Margin:
    """The equivalence margin of a comparison over ``runs`` (one per task) on the samples' ``column``
    (kvbench.specs.metric_kind.equivalence_margin): one task's, or for a pool the smallest of its tasks'
    (equivalence within the narrowest margin is what every task's spec accepts); none if a task has
    none."""
    margins = [equivalence_margin(run.spec.task, run.spec.protocol, column) for run in runs]
    missing = next((m for m in margins if math.isnan(m.value)), None)
    if missing is not None:
        return missing
    smallest = min(margins, key=lambda m: m.value)
    if len({(m.value, m.declared_by) for m in margins}) == 1:
        return smallest
    each = "; ".join(f"{m.declared_by} = {m.value:g}" for m in margins)
    return Margin(smallest.value, f"the smallest of the pooled tasks' ({each})")


def _partner(
    run: StoredRun, every: Mapping[tuple[Arm, str], list[StoredRun]], arm: Arm, role: Role
) -> StoredRun | None:
    """The run of ``arm`` on the same task that pairs with ``run`` in ``role`` (kvbench.results.pairing)."""
    return partner(run.spec, every.get((arm, run.task), ()), role)

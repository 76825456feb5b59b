"""What kind of number a task's metric is, and so which tasks may be pooled into one score and verdict.

A pooled score averages (task, problem) clusters of several tasks, and its verdict is a sign test on
those clusters: both mean something only when every task's problem score is the same kind of number. The
mean of a passkey's exact retrieval (0 or 1) and a fidelity probe's top-1 agreement (0.77) is neither a
retrieval rate nor an agreement. The kind follows from the metric a task really computes, declared here
once: `kvbench compare --pool`, a suite's ``groups`` and every pooled figure of the leaderboard ask it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from kvbench.errors import SpecError
from kvbench.specs.protocol import ProtocolSpec
from kvbench.specs.task import LmEvalSource, ProbeSource, Source, TaskSpec


class MetricKind(str, Enum):
    """How a task's per-sample value reads; a problem's score is the mean over its samples."""

    PASS_FAIL = "pass/fail"
    """Each sample right (1) or wrong (0): a grader's verdict, a probe's exact retrieval."""
    PROPORTION = "proportion"
    """A share in [0, 1] that is more than right or wrong: top-1 agreement with the full cache, partial
    credit (F1), the share of a needle the cache kept."""
    UNBOUNDED = "unbounded"
    """A value on the metric's own scale (a log-probability, a KL divergence, an lm-eval metric kvbench
    does not know): pooled only with the same metric."""

    def __str__(self) -> str:
        return self.value


METRIC_KINDS: dict[str, MetricKind] = {
    # the graders' verdicts and the probes' own metrics
    "pass@1": MetricKind.PASS_FAIL,
    "exact": MetricKind.PASS_FAIL,
    "top1_agreement": MetricKind.PROPORTION,
    # lm-eval metrics that kvbench averages per sample (kvbench.lmeval.tasks refuses any other aggregation)
    "exact_match": MetricKind.PASS_FAIL,
    "acc": MetricKind.PASS_FAIL,
    "em": MetricKind.PASS_FAIL,
    "prompt_level_strict_acc": MetricKind.PASS_FAIL,
    "prompt_level_loose_acc": MetricKind.PASS_FAIL,
    "f1": MetricKind.PROPORTION,
    # the other columns of the samples table a table can rank by (kvbench.results.summary.QUANTITIES)
    "answer_logprob": MetricKind.UNBOUNDED,
    "kl_to_full": MetricKind.UNBOUNDED,
    "needle_survival": MetricKind.PROPORTION,
    "needle_whole_layers": MetricKind.PROPORTION,
}
"""Metric name -> its kind; a name not listed is UNBOUNDED (its own scale, pooled only with itself)."""

GRADED = "pass@1"
"""The metric of the math, choice and code graders, whatever a task names it: each sample right or
wrong (kvbench.graders.registry.GraderVerdict)."""
PROBE_METRICS = {"passkey": "exact", "planted-fact": "exact", "fidelity": "top1_agreement"}
"""The metric each probe computes (kvbench.runner.probe_units): exact greedy retrieval of the needle's
value, or top-1 agreement with the full cache's next-token prediction."""
TASK_METRIC = "metric"
"""The samples column of a task's own metric; the other columns are ranked quantities of their own."""


@dataclass(frozen=True)
class Metric:
    """The metric a task's problem scores are the mean of, and its kind."""

    name: str
    kind: MetricKind

    @property
    def pool(self) -> str:
        """Tasks whose metrics have the same ``pool`` may be pooled: a bounded kind with its kind, an
        unbounded metric with the same metric only."""
        return str(self.kind) if self.kind != MetricKind.UNBOUNDED else f"{self.kind}: {self.name}"

    def __str__(self) -> str:
        return f"{self.kind}: {self.name}"


NEEDLE_QUANTITIES = ("answer_logprob", "needle_survival", "needle_whole_layers")
"""The samples columns a needle probe (passkey, planted-fact) records besides its exact retrieval, which
`--metric` can rank by (kvbench.results.summary.QUANTITIES)."""
NEEDLE_PROBES = ("passkey", "planted-fact")


def own_metric(source: Source, grader: str, metric: str) -> str:
    """The name of the metric a task's own scores are: what its grader or probe computes, or the lm-eval
    metric it names."""
    if isinstance(source, ProbeSource):
        return PROBE_METRICS[source.probe]
    if isinstance(source, LmEvalSource) and grader != "math":
        return metric
    return GRADED


def metric_names(source: Source, grader: str, metric: str) -> tuple[str, ...]:
    """Every metric a task's problems can be compared on: its own, and on a needle probe the quantities
    it also records."""
    needle = isinstance(source, ProbeSource) and source.probe in NEEDLE_PROBES
    return (own_metric(source, grader, metric), *(NEEDLE_QUANTITIES if needle else ()))


def task_metric(task: TaskSpec, column: str = TASK_METRIC) -> Metric:
    """The metric behind a task's problem scores in ``column`` of the samples table: the task's own
    (what its grader or probe computes, or the lm-eval metric it names) or another ranked quantity."""
    name = column if column != TASK_METRIC else own_metric(task.source, task.grader, task.metric)
    return Metric(name, METRIC_KINDS.get(name, MetricKind.UNBOUNDED))


def check_margins(margins: Mapping[str, float], source: Source, grader: str, metric: str) -> None:
    """A ValueError naming the margin and the fix where a task's ``margins`` names a metric it does not
    have, or gives a metric scored in [0, 1] a margin of 1 or more (every policy would be equivalent)."""
    names = metric_names(source, grader, metric)
    for name, margin in margins.items():
        if name not in names:
            raise ValueError(
                f"`margins.{name}`: this task has no metric {name!r}; its metrics are {', '.join(names)}: "
                f"key each margin by one of those (e.g. `margins: {{{names[-1]}: 0.1}}`)"
            )
        kind = METRIC_KINDS.get(name, MetricKind.UNBOUNDED)
        if kind != MetricKind.UNBOUNDED and margin >= 1:
            raise ValueError(
                f"`margins.{name}` is {margin:g}, but {name} is a {kind} metric scored in [0, 1]: a margin "
                "of 1 or more calls every policy equivalent to the null; give one below 1, in the metric's "
                "units (0.02 is 2 points)"
            )


@dataclass(frozen=True)
class Margin:
    """The equivalence margin a comparison uses, and where it was declared."""

    value: float
    """In the metric's units; NaN: none (no equivalence test)."""
    declared_by: str
    """Which spec and field gave it ("task passkey: margins.answer_logprob", "protocol protect-prompt:
    margin"), or why there is none."""


def equivalence_margin(task: TaskSpec, protocol: ProtocolSpec, column: str = TASK_METRIC) -> Margin:
    """The margin of the metric in ``column`` of ``task``'s samples: the one the task declares for it
    (``margins``), else the protocol's ``margin`` for a metric scored in [0, 1] (pass/fail, proportion),
    else none: the protocol's margin is in the units of a [0, 1] score, and a log-probability or a KL
    divergence has others."""
    metric = task_metric(task, column)
    if metric.name in task.margins:
        return Margin(task.margins[metric.name], f"task {task.name}: margins.{metric.name}")
    if metric.kind != MetricKind.UNBOUNDED:
        return Margin(protocol.margin, f"protocol {protocol.name}: margin")
    return Margin(
        math.nan,
        f"none: {metric.name} is not scored in [0, 1] and task {task.name} declares no margins.{metric.name}",
    )


def mixed_kinds(metrics: dict[str, Metric]) -> str | None:
    """None when every task's metric pools with the others; otherwise what each task scores, for an
    error or a note ("passkey (pass/fail: exact), fidelity (proportion: top1_agreement)")."""
    if len({m.pool for m in metrics.values()}) < 2:
        return None
    return ", ".join(f"{task} ({metric})" for task, metric in metrics.items())


def refuse_mixed_pool(where: str, metrics: dict[str, Metric]) -> None:
    """A SpecError naming ``where`` (the flag or field that declares the pool) when its tasks' metrics
    are of different kinds: their pooled mean and verdict would mean nothing."""
    found = mixed_kinds(metrics)
    if found is None:
        return
    raise SpecError(
        f"{where} pools tasks whose metrics are of different kinds: {found}. A pooled score is the mean of "
        "the tasks' problem scores and its verdict a test of that mean, which means something for one kind "
        "only: pool pass/fail tasks together, proportions together, an unbounded metric with the same "
        "metric; or compare these tasks apart, each with its own verdict"
    )


def pools(metrics: dict[str, Metric], tasks: Iterable[str]) -> dict[str, list[str]]:
    """``tasks`` grouped by what may be pooled (Metric.pool), in MetricKind order, each group's tasks in
    the given order."""
    groups: dict[str, list[str]] = {}
    for task in sorted(tasks, key=lambda t: list(MetricKind).index(metrics[t].kind)):
        groups.setdefault(metrics[task].pool, []).append(task)
    return groups

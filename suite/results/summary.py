"""Per-cell numbers from the samples table: the per-problem scores the statistics resample, and rates.

Every rate is a mean over samples; the scores are per problem (mean over its samples), because the
problem, not the sample, is the unit the bootstrap and the paired tests resample.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import duckdb

from kvbench.errors import UnknownNameError

T = TypeVar("T", bound=Sequence[Any])


@dataclass(frozen=True)
class CellSummary:
    run_id: str
    scores: dict[str, float] = field(default_factory=dict)
    """Problem id -> mean of its samples' metric (pass@1 for graded tasks, the probe's metric otherwise),
    or of the quantity summarized (QUANTITIES)."""
    strict: dict[str, float] = field(default_factory=dict)
    """Problem id -> share of its samples correct *and* finished before the token cap."""
    tokens: dict[str, float] = field(default_factory=dict)
    """Problem id -> mean generated tokens of its samples (generation tasks; probes generate none)."""
    truncated: dict[str, float] = field(default_factory=dict)
    """Problem id -> share of its samples stopped by the token cap."""
    correct: int | None = None
    """Samples graded correct (None: no sample has a correct/incorrect verdict)."""
    samples: int = 0
    truncation_rate: float = float("nan")
    no_answer_rate: float = float("nan")
    mean_generated_tokens: float = float("nan")


QUANTITIES = {
    "score": "metric",
    "answer-logprob": "answer_logprob",
    "needle-survival": "needle_survival",
    "needle-whole-layers": "needle_whole_layers",
}
"""What a table can rank arms by (higher is better), by name -> its column in the samples table: the
task's own metric; on the needle probes, the answer's log-probability under the policy's cache, the
share of the needle each layer's KV heads kept, and the share of layers with one head holding it all
(informative where exact retrieval is 0 for every evicting policy)."""

_QUERY = """
SELECT run_id, problem_id, avg({quantity}), avg(strict_correct::INTEGER), count(*),
       sum((finish_reason = 'length')::INTEGER),
       sum(coalesce(no_answer, false)::INTEGER),
       sum(generated_tokens), avg(generated_tokens), sum(correct::INTEGER)
FROM samples WHERE list_contains(?, run_id) GROUP BY run_id, problem_id
"""


def summarize(
    con: duckdb.DuckDBPyConnection, run_ids: Iterable[str], quantity: str = "score"
) -> dict[str, CellSummary]:
    """One summary per run id (empty for a run without samples), from one parameterised query; its
    per-problem scores are the means of ``quantity`` (one of QUANTITIES)."""
    if quantity not in QUANTITIES:
        raise UnknownNameError("quantity", quantity, list(QUANTITIES))
    query = _QUERY.format(quantity=QUANTITIES[quantity])  # a column name from the table above, never input
    run_ids = list(dict.fromkeys(run_ids))
    problems: dict[str, list[_Problem]] = {r: [] for r in run_ids}
    for row in con.execute(query, [run_ids]).fetchall():
        problems[row[0]].append(_Problem(*row[1:]))
    out = {}
    for run_id, got in problems.items():
        n = sum(p.n for p in got)
        graded = [p.correct for p in got if p.correct is not None]
        out[run_id] = CellSummary(
            run_id,
            # a problem none of whose samples has a metric is not scored
            scores={p.problem: float(p.metric) for p in got if p.metric is not None},
            # continuous probe metrics have no correct/strict verdict
            strict={p.problem: float(p.strict) for p in got if p.strict is not None},
            tokens={p.problem: float(p.mean_tokens) for p in got if p.mean_tokens is not None},
            truncated={p.problem: p.cut / p.n for p in got},
            correct=sum(graded) if graded else None,
            samples=n,
            truncation_rate=sum(p.cut for p in got) / n if n else float("nan"),
            no_answer_rate=sum(p.no_answer for p in got) / n if n else float("nan"),
            mean_generated_tokens=sum(p.tokens or 0 for p in got) / n if n else float("nan"),
        )
    return out


class _Problem(NamedTuple):
    """One problem of one run, as _QUERY sums its samples."""

    problem: str
    metric: float | None
    strict: float | None
    n: int
    cut: int
    no_answer: int
    tokens: int | None
    mean_tokens: float | None
    correct: int | None


def most_complete(
    runs: Iterable[T], summaries: Mapping[str, CellSummary], key: Callable[[T], Hashable]
) -> list[T]:
    """One run per key: the one with the most samples, the later one on a tie.

    An arm run again with a larger ``--limit`` or more samples has a new run id (its identity
    differs) but answers the same question: the larger run supersedes the smaller one in tables.
    ``runs`` are ``(run_id, ...)`` rows in the order they were created.
    """
    chosen: dict[Hashable, T] = {}
    for run in runs:
        held = chosen.get(key(run))
        if held is None or summaries[run[0]].samples >= summaries[held[0]].samples:
            chosen[key(run)] = run
    return list(chosen.values())

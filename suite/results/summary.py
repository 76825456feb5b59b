"""Per-cell numbers from the samples table: the per-problem scores the statistics resample, and rates.

Every rate is a mean over samples; the scores are per problem (mean over its samples), because the
problem, not the sample, is the unit the bootstrap and the paired tests resample.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
    parts: dict[str, dict] = {
        r: {
            "scores": {},
            "strict": {},
            "tokens": {},
            "cut": {},
            "n": 0,
            "none": 0,
            "sum": 0,
            "truncated": 0,
            "right": None,
        }
        for r in run_ids
    }
    rows = con.execute(query, [run_ids]).fetchall()
    for run_id, problem, metric, strict, n, cut, none, tokens, mean_tokens, right in rows:
        part = parts[run_id]
        if metric is not None:  # a problem none of whose samples has a metric is not scored
            part["scores"][problem] = float(metric)
        if strict is not None:  # continuous probe metrics have no correct/strict verdict
            part["strict"][problem] = float(strict)
        if mean_tokens is not None:
            part["tokens"][problem] = float(mean_tokens)
        if right is not None:
            part["right"] = (part["right"] or 0) + right
        part["cut"][problem] = cut / n
        part["n"] += n
        part["truncated"] += cut
        part["none"] += none
        part["sum"] += tokens or 0
    out = {}
    for run_id, p in parts.items():
        n = p["n"]
        out[run_id] = CellSummary(
            run_id,
            scores=p["scores"],
            strict=p["strict"],
            tokens=p["tokens"],
            truncated=p["cut"],
            correct=p["right"],
            samples=n,
            truncation_rate=p["truncated"] / n if n else float("nan"),
            no_answer_rate=p["none"] / n if n else float("nan"),
            mean_generated_tokens=p["sum"] / n if n else float("nan"),
        )
    return out


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

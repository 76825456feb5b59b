"""The rows of the table `kvbench run` ends with: one per task, each policy against the null and the full
cache (kvbench.commands.run builds them from the cells it ran)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from kvbench.results.stats import Estimate, PairedComparison


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


def as_dicts(rows: Sequence[ReportRow]) -> list[dict]:
    return [asdict(r) for r in rows]

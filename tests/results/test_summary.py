"""Per-cell rates from the samples table, against counts made by hand on a small real DuckDB file."""

from __future__ import annotations

import math
from pathlib import Path

import duckdb

from kvbench.results.summary import summarize
from kvbench.store.ingest import SCHEMA

# run, problem, sample, metric, correct, strict, finish, tokens, no_answer
SAMPLES = [
    ("a", "p1", 0, 1.0, True, True, "stop", 100, False),
    ("a", "p1", 1, 1.0, True, False, "length", 400, False),
    ("a", "p2", 0, 0.0, False, False, "length", 400, True),
    ("a", "p2", 1, 0.0, False, False, "stop", 50, True),
    ("b", "p1", 0, 0.75, None, None, "teacher-forced", 10, None),
]


def test_summary_rates_are_counted_over_samples_and_scores_over_problems(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "kvbench.duckdb"))
    con.execute(SCHEMA)
    for run, problem, sample, metric, correct, strict, finish, tokens, no_answer in SAMPLES:
        con.execute(
            "INSERT INTO samples (run_id, problem_id, sample, metric, correct, strict_correct, "
            "finish_reason, generated_tokens, no_answer) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [run, problem, sample, metric, correct, strict, finish, tokens, no_answer],
        )
    summaries = summarize(con, ["a", "b", "missing"])
    a, b, missing = summaries["a"], summaries["b"], summaries["missing"]
    assert a.scores == {"p1": 1.0, "p2": 0.0} and a.strict == {"p1": 0.5, "p2": 0.0}
    assert (a.samples, a.truncation_rate, a.no_answer_rate, a.mean_generated_tokens) == (4, 0.5, 0.5, 237.5)
    assert b.scores == {"p1": 0.75} and b.strict == {} and b.no_answer_rate == 0.0
    assert missing.samples == 0 and math.isnan(missing.truncation_rate)
    assert summarize(con, ["' OR 1=1 --"])["' OR 1=1 --"].samples == 0

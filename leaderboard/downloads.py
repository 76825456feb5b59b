"""The published tables as files: the leaderboard table, the runs behind it and their samples.

What a file holds is what the page may show: runs without their resolved spec (it names local data
paths) and with the hardware's CPU and GPU models only; samples without a private task's output, and
at most ROW_CAP rows with each output cut at OUTPUT_CAP characters.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from kvbench.leaderboard.public import OUTPUT_CAP, ROW_CAP
from kvbench.leaderboard.queries import Capped
from kvbench.printable import spreadsheet_cell
from kvbench.store.board_tables import counted_runs
from kvbench.store.ingest import reading

LICENCE = (
    "**Licence.** kvbench's own results (scores, intervals, verdicts, per-sample metrics and the outputs "
    "on its synthetic probes) are published under [CC BY 4.0](https://creativecommons.org/licenses/by/4.0/): "
    "cite kvbench. Task texts, and model outputs on them, keep their sources' licences (GSM8K: MIT; "
    "MATH-500, AIME, HMMT, LiveCodeBench: see each dataset). A private task (GPQA) is published as "
    "problem ids, hashes and verdicts only: its questions and the models' outputs on them are never "
    "exported or shown, as its authors ask."
)

_RUNS = """
SELECT run_id, label, role, model, task, task_version, policy, policy_params, protocol, protection,
       budget, buffer, n_avg, ratio, samples_per_problem, protocol_seed, visibility,
       adapter, device, dtype, attention, kvbench_version, git_sha, git_dirty,
       hardware->>'cpu' AS cpu, hardware->>'gpu' AS gpu, hardware->>'gpu_count' AS gpu_count,
       sha256(spec::VARCHAR)[:16] AS spec_sha256, to_timestamp(created) AS created
FROM {runs} WHERE list_contains(?, run_id) ORDER BY label, run_id
"""

_SAMPLES = """
SELECT s.run_id, s.task, s.problem_id, s.problem_hash, s.sample, s.seed, s.metric, s.correct,
       s.strict_correct, s.finish_reason, s.generated_tokens, s.evictions, s.no_answer,
       s.answer_logprob, s.kl_to_full, s.needle_survival, s.needle_whole_layers,
       CASE WHEN r.visibility = 'public' THEN left(s.output, $cut) END AS output,
       CASE WHEN r.visibility = 'public' THEN length(s.output) > $cut END AS output_cut
FROM samples s JOIN {runs} r USING (run_id)
WHERE list_contains($runs, s.run_id) ORDER BY s.run_id, s.problem_id, s.sample LIMIT $limit
"""


def published_runs(database: Path, run_ids: list[str]) -> pd.DataFrame:
    with reading(database) as con:
        return con.execute(_RUNS.format(runs=counted_runs(con)), [run_ids]).df()


def published_samples(database: Path, run_ids: list[str], limit: int = ROW_CAP) -> Capped:
    """The first ``limit`` sample rows of the runs (by run, problem, sample), and how many there are."""
    with reading(database) as con:
        rows = con.execute(
            _SAMPLES.format(runs=counted_runs(con)), {"runs": run_ids, "cut": OUTPUT_CAP, "limit": limit}
        ).df()
    return Capped(rows, sample_count(database, run_ids))


def sample_count(database: Path, run_ids: list[str]) -> int:
    with reading(database) as con:
        found = con.execute(
            f"SELECT count(*) FROM samples JOIN {counted_runs(con)} USING (run_id) "
            "WHERE list_contains(?, run_id)",
            [run_ids],
        ).fetchone()
    return found[0] if found else 0


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """The frame as CSV, each text cell a spreadsheet would run as a formula shown as text instead."""
    text = frame.select_dtypes(include=["object", "string"]).columns
    safe = frame.assign(**{column: frame[column].map(spreadsheet_cell) for column in text})
    return safe.to_csv(index=False).encode()


def parquet_bytes(frame: pd.DataFrame) -> bytes:
    return frame.to_parquet(index=False)  # no path: pandas returns the file's bytes


FORMATS = {"CSV": (csv_bytes, "text/csv"), "Parquet": (parquet_bytes, "application/vnd.apache.parquet")}
"""What a table can be downloaded as: how its bytes are made, and their MIME type."""


def deferred(
    encode: Callable[[pd.DataFrame], bytes], rows: Callable[[], pd.DataFrame]
) -> Callable[[], bytes]:
    """A file's bytes made only when asked for (a download button's callable)."""
    return lambda: encode(rows())

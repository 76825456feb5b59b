"""Shards: each run's rows in its own Parquet files, one per problem, written by atomic rename.

runs/shards/<run_id>/manifest.json   the resolved spec and the provenance of the run
runs/shards/<run_id>/<problem>.parquet   the k sample rows of one problem

A problem's file appears whole or not at all, so an interrupted run loses at most the problem it was
working on, and a rerun skips every problem whose file exists: nothing is lost and nothing duplicated.
Two processes computing the same problem write identical files under the same name.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pydantic

from kvbench.store.atomic import atomic_write
from kvbench.store.records import SAMPLE_SCHEMA, SampleRecord


def problem_key(problem_id: str) -> str:
    return hashlib.sha256(problem_id.encode()).hexdigest()[:16]


# Measurements that shards of schema 4 kept inside `secondary`, and the column each has become.
_PROMOTED = {
    "no_answer": "no_answer",
    "grader": "grader_version",
    "answer_logprob": "answer_logprob",
    "kl_to_full": "kl_to_full",
    "eviction_seconds": "eviction_seconds",
}


# what every shard since schema 4 holds; the rest of the current schema may be derived by upgrade()
ADDED_IN_6 = ("needle_survival", "needle_whole_layers", "needle_survival_by_head")
"""Columns schema 6 added; older shards read them as missing (None)."""
ADDED_IN_8 = ("needle_high_precision", "kv_budget_tokens", "kv_budget_bytes", "kv_peak_bytes")
"""Columns schema 8 added (mixed precision and the budget's bytes); older shards read them as missing."""
ADDED_IN_9 = ("prompt_held_any", "prompt_held_all", "head_coverage", "kept_by_age", "needle_events")
"""Columns schema 9 added (retention telemetry); older shards read them as missing."""
_REQUIRED = [
    name
    for name in SAMPLE_SCHEMA.names
    if name not in (*_PROMOTED.values(), *ADDED_IN_6, *ADDED_IN_8, *ADDED_IN_9)
]


def upgrade(table: pa.Table) -> pa.Table:
    """A shard's rows in the current sample schema: a shard written before its measurements became columns
    (schema 4) has them moved out of ``secondary``, values unchanged; columns added later (schema 6's
    needle survival, schema 8's budget bytes, schema 9's retention telemetry) read as missing."""
    if set(SAMPLE_SCHEMA.names) <= set(table.column_names):
        return table.select(SAMPLE_SCHEMA.names).cast(SAMPLE_SCHEMA)
    rows = table.to_pylist()
    for row in rows:
        extra = json.loads(row.get("secondary") or "{}")
        for key, name in _PROMOTED.items():
            if name not in row:  # schema 4 kept it in `secondary`
                row[name] = extra.pop(key, None)
        row["eviction_seconds"] = row["eviction_seconds"] or 0.0
        row["secondary"] = extra
        row.setdefault("reason", None)
    return pa.Table.from_pylist([SampleRecord(**r).row() for r in rows], schema=SAMPLE_SCHEMA)


def read_records(path: Path) -> list[SampleRecord]:
    """A shard's samples as records (a shard of an older schema is upgraded as it is read)."""
    rows = upgrade(pq.read_table(path)).to_pylist()
    return [SampleRecord(**{**row, "secondary": json.loads(row["secondary"] or "{}")}) for row in rows]


def read_shard(path: Path) -> pa.Table | str:
    """A shard's rows in the current schema, or why it cannot be used."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        return f"does not read back as Parquet ({exc})"
    return shard_rows(table)


def shard_rows(table: pa.Table) -> pa.Table | str:
    """A shard's table, read however the caller bounded it, in the current schema; or why it cannot be
    used."""
    missing = [name for name in _REQUIRED if name not in table.column_names]
    if missing:
        return f"lacks the columns {', '.join(missing)}"
    if table.num_rows == 0:
        return "holds no sample"
    try:
        return upgrade(table)
    except (pa.ArrowException, pydantic.ValidationError, json.JSONDecodeError, TypeError) as exc:
        return f"does not hold samples of a known schema ({str(exc).splitlines()[0]})"


class ShardStore:
    """The shards of one run (one cell)."""

    def __init__(self, root: Path, run_id: str) -> None:
        self.dir = root / "shards" / run_id
        self.run_id = run_id

    def shard(self, problem_id: str) -> Path:
        return self.dir / f"{problem_key(problem_id)}.parquet"

    def has(self, problem_id: str) -> bool:
        """Whether the problem's shard is stored *and reads back*; a damaged shard is set aside (renamed
        ``*.parquet.damaged``), so that the problem is computed again."""
        path = self.shard(problem_id)
        if not path.is_file():
            return False
        if isinstance(read_shard(path), str):  # why it cannot be used
            os.replace(path, path.with_name(path.name + ".damaged"))
            return False
        return True

    @property
    def manifest(self) -> Path:
        return self.dir / "manifest.json"

    def write(self, problem_id: str, records: Sequence[SampleRecord]) -> None:
        table = pa.Table.from_pylist([r.row() for r in records], schema=SAMPLE_SCHEMA)
        atomic_write(self.shard(problem_id), lambda temp: pq.write_table(table, temp))

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
import platform
import subprocess
import tempfile
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kvbench.bench.machine import describe_machine

SAMPLE_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("task", pa.string()),
        ("problem_id", pa.string()),
        ("problem_hash", pa.string()),
        ("sample", pa.int32()),
        ("seed", pa.int64()),
        ("metric", pa.float64()),
        ("correct", pa.bool_()),
        ("strict_correct", pa.bool_()),
        ("finish_reason", pa.string()),
        ("reason", pa.string()),
        ("generated_tokens", pa.int32()),
        ("evictions", pa.int32()),
        ("secondary", pa.string()),
        ("output", pa.string()),
        ("wall_seconds", pa.float64()),
    ]
)
PACKAGES = ("torch", "transformers", "duckdb", "pyarrow", "numpy", "scipy", "pydantic")


def problem_key(problem_id: str) -> str:
    return hashlib.sha256(problem_id.encode()).hexdigest()[:16]


def sample_row(
    run_id: str,
    task: str,
    problem_id: str,
    sample: int,
    seed: int,
    *,
    metric: float,
    correct: bool | None,
    strict_correct: bool | None,
    finish_reason: str,
    reason: str | None = None,
    generated_tokens: int,
    evictions: int,
    secondary: dict[str, Any],
    output: str | None,
    wall_seconds: float,
) -> dict[str, Any]:
    """One row of the samples table (SAMPLE_SCHEMA), the same for every kind of task."""
    return {
        "run_id": run_id,
        "task": task,
        "problem_id": problem_id,
        "problem_hash": problem_key(problem_id),
        "sample": sample,
        "seed": seed,
        "metric": metric,
        "correct": correct,
        "strict_correct": strict_correct,
        "finish_reason": finish_reason,
        "reason": reason,
        "generated_tokens": generated_tokens,
        "evictions": evictions,
        "secondary": json.dumps(secondary),
        "output": output,
        "wall_seconds": wall_seconds,
    }


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(handle)
    try:
        write(temp)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def git_state(where: Path) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    return {"sha": sha, "dirty": bool(git("status", "--porcelain")) if sha else None}


def provenance(device: str = "cpu") -> dict[str, Any]:
    import kvbench

    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = None
    return {
        "kvbench": kvbench.__version__,
        "git": git_state(Path(kvbench.__file__).resolve().parent),
        "packages": packages,
        "python": platform.python_version(),
        "hardware": describe_machine(device),
    }


def shard_problem(path: Path) -> str | None:
    """Why a shard cannot be used, or None when it reads back whole with the samples schema."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        return f"does not read back as Parquet ({exc})"
    missing = [name for name in SAMPLE_SCHEMA.names if name not in table.column_names]
    if missing:
        return f"lacks the columns {', '.join(missing)}"
    if table.num_rows == 0:
        return "holds no sample"
    return None


def read_manifest(path: Path) -> dict[str, Any] | None:
    """A run's manifest, or None when it does not read back as a JSON object with a resolved spec."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("spec"), dict) else None


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
        if shard_problem(path) is not None:
            os.replace(path, path.with_name(path.name + ".damaged"))
            return False
        return True

    def write_manifest(self, record: dict[str, Any], extra: dict[str, Any]) -> None:
        path = self.dir / "manifest.json"
        if path.is_file() and read_manifest(path) is not None:
            return
        manifest = {"run_id": self.run_id, "spec": record, "created": time.time(), **extra}
        _atomic_write(path, lambda temp: Path(temp).write_text(json.dumps(manifest, indent=2, default=str)))

    def write(self, problem_id: str, rows: Sequence[dict[str, Any]]) -> None:
        table = pa.Table.from_pylist(list(rows), schema=SAMPLE_SCHEMA)
        _atomic_write(self.shard(problem_id), lambda temp: pq.write_table(table, temp))

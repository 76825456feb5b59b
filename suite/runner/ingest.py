"""Ingest: shards into runs/kvbench.duckdb, idempotently, one writer at a time.

Writers take an exclusive file lock for the few seconds an ingest lasts, so concurrent `kvbench run`
processes never corrupt the database; each shard file is read once (``ingested_files``) and rows are
keyed by (run_id, problem_id, sample), so re-ingesting anything adds nothing. After each ingest a
snapshot copy is published by atomic rename: readers (the leaderboard) open the snapshot, never the
writer's file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb

from kvbench.errors import PrerequisiteError
from kvbench.runner.store import read_manifest, shard_problem

SCHEMA_VERSION = 4
DATABASE = "kvbench.duckdb"
SNAPSHOT = "kvbench.snapshot.duckdb"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY, role VARCHAR, label VARCHAR,
    adapter VARCHAR, device VARCHAR, dtype VARCHAR, attention VARCHAR,
    model VARCHAR, task VARCHAR, task_version INTEGER, policy VARCHAR, policy_params JSON,
    protocol VARCHAR, protection VARCHAR, budget INTEGER, buffer INTEGER, n_avg DOUBLE, ratio DOUBLE,
    samples_per_problem INTEGER, protocol_seed BIGINT, visibility VARCHAR,
    kvbench_version VARCHAR, git_sha VARCHAR, git_dirty BOOLEAN, packages JSON, hardware JSON,
    created DOUBLE, spec JSON
);
CREATE TABLE IF NOT EXISTS samples (
    run_id VARCHAR, task VARCHAR, problem_id VARCHAR, problem_hash VARCHAR, sample INTEGER, seed BIGINT,
    metric DOUBLE, correct BOOLEAN, strict_correct BOOLEAN, finish_reason VARCHAR, reason VARCHAR,
    generated_tokens INTEGER,
    evictions INTEGER, secondary JSON, output VARCHAR, wall_seconds DOUBLE,
    PRIMARY KEY (run_id, problem_id, sample)
);
CREATE TABLE IF NOT EXISTS ingested_files (path VARCHAR PRIMARY KEY, fingerprint VARCHAR);
CREATE TABLE IF NOT EXISTS bench (
    file VARCHAR, created DOUBLE, model VARCHAR, policy VARCHAR, budget INTEGER, buffer INTEGER,
    tokens INTEGER, tokens_per_second DOUBLE, speed_vs_full DOUBLE, peak_kv_bytes BIGINT,
    memory_vs_full DOUBLE, ms_per_event DOUBLE, machine JSON,
    PRIMARY KEY (file, policy)
);
"""


@dataclass(frozen=True)
class IngestReport:
    runs: int
    files: int
    database: Path
    snapshot: Path
    """The copy readers open (read-only), so that they never hold a lock a writer needs."""


def _fingerprint(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


@contextmanager
def _writer_lock(root: Path):
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".ingest.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run_row(manifest: dict) -> tuple:
    spec = manifest["spec"]
    protocol, task = spec["protocol"], spec["task"]
    git = manifest.get("git") or {}
    # a run planned before the runtime joined the identity ran with the hf adapter's defaults
    runtime = spec.get("runtime") or {"adapter": "hf", "device": "cpu", "attention": "sdpa"}
    return (
        manifest["run_id"],
        manifest.get("role"),
        manifest.get("label"),
        runtime["adapter"],
        runtime["device"],
        runtime.get("dtype", spec["model"]["dtype"]),
        runtime["attention"],
        spec["model"]["name"],
        task["name"],
        task["version"],
        spec["policy"]["name"],
        json.dumps(spec["policy"]["params"]),
        protocol["name"],
        protocol["protection"],
        spec["budget"],
        protocol["buffer"],
        spec["n_avg"],
        spec["ratio"],
        spec["samples"],
        protocol["seed"],
        task["visibility"],
        manifest.get("kvbench"),
        git.get("sha"),
        git.get("dirty"),
        json.dumps(manifest.get("packages")),
        json.dumps(manifest.get("hardware")),
        manifest.get("created"),
        json.dumps(spec),
    )


def _ingest_bench(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    """`kvbench bench decode --out` results (runs/bench/*.json): decode speed and KV memory per policy."""
    for path in sorted((root / "bench").glob("*.json")):
        record = json.loads(path.read_text())
        settings = record["settings"]
        for r in record["results"]:
            con.execute(
                "INSERT OR IGNORE INTO bench VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    path.name,
                    record["created"],
                    settings["model"],
                    r["policy"],
                    settings["budget"],
                    settings["buffer"],
                    r["tokens"],
                    r["tokens_per_second"],
                    r["speed_vs_full"],
                    r["peak_kv_bytes"],
                    r["memory_vs_full"],
                    r["ms_per_event"],
                    json.dumps(record["machine"]),
                ],
            )


def _unreadable(manifests: dict[Path, dict | None], shards: list[Path]) -> list[str]:
    """Every manifest and new shard that does not read back, each with why."""
    bad = [f"{path}: not a JSON manifest with a resolved spec" for path, m in manifests.items() if m is None]
    for path in shards:
        problem = shard_problem(path)
        if problem is not None:
            bad.append(f"{path}: {problem}")
    return bad


def ingest(root: Path) -> IngestReport:
    """Merge every shard under ``root/shards`` into ``root/kvbench.duckdb`` and publish a snapshot.

    Every manifest and new shard is read back before anything is written, and everything is written in
    one transaction: a damaged file is named with what to do, and the database is left as it was.
    """
    shard_root = root / "shards"
    with _writer_lock(root):
        manifests = sorted(shard_root.glob("*/manifest.json")) if shard_root.is_dir() else []
        files = sorted(shard_root.glob("*/*.parquet")) if shard_root.is_dir() else []
        database = root / DATABASE
        con = duckdb.connect(str(database))
        try:
            con.execute("BEGIN TRANSACTION")
            con.execute(SCHEMA)
            found = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if found is not None and found[0] != str(SCHEMA_VERSION):
                raise PrerequisiteError(
                    f"{database} has schema {found[0]}, this kvbench writes {SCHEMA_VERSION}: the shards are "
                    f"the source of truth, so delete {database} and run `kvbench ingest --out {root}`"
                )
            done = dict(con.execute("SELECT path, fingerprint FROM ingested_files").fetchall())
            seen = {os.path.relpath(f, root): _fingerprint(f) for f in files}
            new = [root / path for path, print_ in seen.items() if done.get(path) != print_]
            read = {path: read_manifest(path) for path in manifests}  # each manifest is read once
            bad = _unreadable(read, new)
            if bad:
                raise PrerequisiteError(
                    f"{len(bad)} result file(s) under {shard_root} are damaged; nothing was ingested:\n  "
                    + "\n  ".join(bad)
                    + "\nDelete (or move away) each damaged shard and run the same `kvbench run` again: it "
                    "computes exactly the missing problems. A damaged manifest.json is rewritten by that run."
                )
            con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
            for manifest in read.values():
                row = _run_row(manifest)
                con.execute(f"INSERT OR IGNORE INTO runs VALUES ({', '.join('?' * len(row))})", list(row))
            if new:
                # a shard replaced by `kvbench grade` replaces its rows: same keys, new verdicts
                con.execute(
                    "INSERT OR REPLACE INTO samples BY NAME SELECT * FROM read_parquet(?)",
                    [[str(f) for f in new]],
                )
                con.executemany(
                    "INSERT OR REPLACE INTO ingested_files VALUES (?, ?)",
                    [[os.path.relpath(f, root), seen[os.path.relpath(f, root)]] for f in new],
                )
            _ingest_bench(con, root)
            con.execute("COMMIT")
            con.execute("CHECKPOINT")
        except BaseException:
            with contextlib.suppress(duckdb.Error):  # nothing to roll back if BEGIN itself failed
                con.execute("ROLLBACK")
            raise
        finally:
            con.close()
        staging = root / f".{SNAPSHOT}.tmp"
        shutil.copyfile(database, staging)
        os.replace(staging, root / SNAPSHOT)
    return IngestReport(runs=len(manifests), files=len(new), database=database, snapshot=root / SNAPSHOT)

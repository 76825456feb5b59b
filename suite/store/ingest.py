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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import duckdb
import pyarrow as pa

from kvbench.errors import PrerequisiteError, SpecError, StorageError
from kvbench.store.atomic import atomic_write, write_failure
from kvbench.store.manifest import RunManifest
from kvbench.store.records import (
    SAMPLE_KEY,
    SCHEMA_VERSION,
    RunRecord,
    SampleRecord,
    run_table,
    table_ddl,
)
from kvbench.store.shards import read_shard

DATABASE = "kvbench.duckdb"


def snapshot_of(database: Path) -> Path:
    """The copy of ``database`` published after each write, which readers open (read-only), so that they
    never hold a lock a writer needs."""
    return database.with_name(f"{database.stem}.snapshot{database.suffix}")


def rebuild_hint(database: Path) -> str:
    """How to rebuild ``database`` (a writer's file or its snapshot): a results folder's from its shards, a
    leaderboard's from the bundles it accepted (kept in ``submissions/`` beside it)."""
    root = database.parent
    # the writer's file of a snapshot (a writer's file is its own)
    writer = database.with_name(database.stem.removesuffix(".snapshot") + database.suffix)
    ingest = f"`kvbench ingest --rebuild --out {root}` rebuilds a results folder's database from its shards"
    board = f"`kvbench accept --rebuild --db {writer}` rebuilds a leaderboard's from its bundles"
    if (root / "shards").is_dir():
        return f"Rebuild it: {ingest}"
    if (root / "submissions").is_dir():
        return f"Rebuild it: {board}"
    return f"Rebuild it: {ingest}; {board}"


_FULL = ("No space left", "Disk quota", "File too large")
_DENIED = ("Permission denied", "Read-only file system")
_DAMAGED = (
    duckdb.IOException,
    duckdb.SerializationException,
    duckdb.InternalException,
    duckdb.FatalException,
)


def database_failure(database: Path, exc: duckdb.Error, fix: str) -> NoReturn:
    """Raise what to tell the user when DuckDB failed on ``database``: its file system is full or read-only,
    another process holds it, or it is damaged (then ``fix`` says how to rebuild it); any other error is
    raised as it is (it then says more). DuckDB's errors carry no errno: its message says which."""
    text = str(exc)
    line = text.splitlines()[0] if text else type(exc).__name__
    if any(marker in text for marker in _FULL):
        raise StorageError(
            f"cannot write {database}: {line}. Free space on its file system, then run the same command "
            "again: nothing stored is lost (a failed write leaves the database as it was)"
        ) from exc
    if any(marker in text for marker in _DENIED):
        raise StorageError(
            f"cannot write {database}: {line}. Give a folder you can write to, or make this one writable"
        ) from exc
    if "Conflicting lock" in text:
        raise StorageError(
            f"{database} is open in another process ({line}): let it finish or stop it; readers such as "
            "the leaderboard open the snapshot, never this file"
        ) from exc
    if isinstance(exc, _DAMAGED):
        raise StorageError(
            f"{database} cannot be read: it is damaged or not a DuckDB database ({line}). {fix}"
        ) from exc
    raise exc


@contextmanager
def reading(database: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """``database`` opened read-only. A file that does not read as a DuckDB database (empty, truncated)
    is a StorageError naming it and how to rebuild it, wherever in the block DuckDB finds out."""
    try:
        with duckdb.connect(str(database), read_only=True) as con:
            yield con
    except duckdb.Error as exc:
        database_failure(database, exc, rebuild_hint(database))


SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
{table_ddl(RunRecord, "runs", ("run_id",))};
{table_ddl(SampleRecord, "samples", SAMPLE_KEY)};
CREATE TABLE IF NOT EXISTS ingested_files (path VARCHAR PRIMARY KEY, fingerprint VARCHAR);
CREATE TABLE IF NOT EXISTS bench (
    file VARCHAR, created DOUBLE, model VARCHAR, policy VARCHAR, budget INTEGER, buffer INTEGER,
    tokens INTEGER, tokens_per_second DOUBLE, speed_vs_full DOUBLE, peak_kv_bytes BIGINT,
    memory_vs_full DOUBLE, ms_per_event DOUBLE, machine JSON,
    PRIMARY KEY (file, policy)
);
ALTER TABLE bench ADD COLUMN IF NOT EXISTS kind VARCHAR DEFAULT 'decode';
ALTER TABLE bench ADD COLUMN IF NOT EXISTS adapter VARCHAR DEFAULT 'hf';
ALTER TABLE bench ADD COLUMN IF NOT EXISTS details JSON;
"""


@dataclass(frozen=True)
class IngestReport:
    runs: int
    files: int
    database: Path
    snapshot: Path


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, rows: pa.Table, verb: str = "INSERT") -> None:
    """Arrow ``rows`` into ``table`` by column name, with ``verb`` (``INSERT``, ``INSERT OR IGNORE`` or
    ``INSERT OR REPLACE``); ``table`` is one of kvbench's own tables, never a name from a file."""
    con.register("rows_in", rows)
    try:
        con.execute(f"{verb} INTO {table} BY NAME SELECT * FROM rows_in")
    finally:
        con.unregister("rows_in")


def _fingerprint(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


@contextmanager
def publishing(database: Path) -> Iterator[Path]:
    """The writer lock held over the block, which writes ``database``; then, unless it raised, a copy of
    ``database`` published as its snapshot by atomic rename. Yields the snapshot's path."""
    lock = database.parent / ".ingest.lock"
    try:
        database.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock, "w")  # noqa: SIM115 (closed below, after the lock is released)
    except OSError as exc:
        write_failure(lock, exc)
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield snapshot_of(database)
            atomic_write(snapshot_of(database), lambda temp: shutil.copyfile(database, temp))
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


SERVE_DETAILS = (
    "requests",
    "peak_running",
    "pool_blocks",
    "preemptions",
    "tpot_ms",
    "tpot_vs_full",
    "concurrency_vs_full",
    "requests_per_second",
)
"""What a `kvbench bench serve` row keeps beside the columns it shares with `bench decode`."""


def _ingest_bench(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    """`kvbench bench decode --out` and `kvbench bench serve --out` results (runs/bench/*.json): speed and
    KV memory per policy. A serve row's tokens/s is output tokens/s under a fixed pool, its memory the
    most KV blocks held; its concurrency, preemptions and TPOT are in ``details``. Every file is read
    before any is written: one that does not read as a record is named, and nothing is ingested."""
    rows: dict[Path, list[list]] = {}
    bad = []
    for path in sorted((root / "bench").glob("*.json")):
        try:
            rows[path] = _bench_rows(path)
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            bad.append(f"{path}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else '-'}")
    if bad:
        raise PrerequisiteError(
            f"{len(bad)} benchmark record(s) under {root / 'bench'} do not read as `kvbench bench` "
            "results; nothing was ingested:\n  " + "\n  ".join(bad) + "\nMove each away (or delete it) "
            f"and run `kvbench ingest --out {root}` again; `kvbench bench decode --out {root}` records a "
            "benchmark anew."
        )
    for path, values in rows.items():
        try:
            con.executemany(
                "INSERT OR IGNORE INTO bench (file, created, model, policy, budget, buffer, tokens, "
                "tokens_per_second, speed_vs_full, peak_kv_bytes, memory_vs_full, ms_per_event, machine, "
                "kind, adapter, details) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )
        except duckdb.ConversionException as exc:
            raise PrerequisiteError(
                f"{path}: a value of the wrong type ({str(exc).splitlines()[0]}); nothing was ingested. Move "
                f"it away (or delete it) and run `kvbench ingest --out {root}` again."
            ) from exc


def _bench_rows(path: Path) -> list[list]:
    """The bench table's rows of one `kvbench bench` record."""
    record = json.loads(path.read_text())
    settings = record["settings"]
    serve = path.name.startswith("serve-")
    rows = []
    for r in record["results"]:
        if serve:
            block_bytes = r["extra"]["block_bytes"]
            full = record["results"][0]
            values = [r["output_len"], r["output_tokens_per_second"], r["speed_vs_full"],
                      r["peak_blocks"] * block_bytes, r["peak_blocks"] / max(full["peak_blocks"], 1),
                      r["select_ms_per_event"] + r["move_ms_per_event"]]  # fmt: skip
            details = {k: r[k] for k in SERVE_DETAILS}
        else:
            values = [r["tokens"], r["tokens_per_second"], r["speed_vs_full"], r["peak_kv_bytes"],
                      r["memory_vs_full"], r["ms_per_event"]]  # fmt: skip
            details = {k: r[k] for k in ("precision", "kv_budget_tokens") if r.get(k) is not None}
        rows.append(
            [
                path.name,
                record["created"],
                settings["model"],
                r["policy"],
                settings["budget"],
                settings["buffer"],
                *values,
                json.dumps(record["machine"]),
                "serve" if serve else "decode",
                settings.get("adapter", "hf"),
                json.dumps(details),
            ]
        )
    return rows


def _ingest_analyses(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    """`kvbench analyze values` tables (runs/analysis/*.parquet), loaded whole into ``value_analysis``:
    they are small, and each file is one analysis written at once."""
    files = sorted((root / "analysis").glob("values-*.parquet"))
    if not files:
        return
    # the paths are a bound list: a file's name (or the results folder's) never becomes SQL
    con.execute(
        "CREATE OR REPLACE TABLE value_analysis AS SELECT * FROM read_parquet(?, union_by_name=true)",
        [[p.as_posix() for p in files]],
    )


@contextmanager
def transaction(database: Path, schema: str, fix: str) -> Iterator[duckdb.DuckDBPyConnection]:
    """One transaction on ``database`` with ``schema``'s tables created and its record schema checked
    (``fix`` says what to do about another): committed and checkpointed when the block ends, else rolled
    back, so that a failed write leaves the database as it was. Hold the writer lock around it."""
    try:
        with duckdb.connect(str(database)) as con:
            try:
                con.execute("BEGIN TRANSACTION")
                con.execute(schema)
                found = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if found is not None and found[0] != str(SCHEMA_VERSION):
                    raise PrerequisiteError(
                        f"{database} has record schema {found[0]}, "
                        f"this kvbench writes {SCHEMA_VERSION}: {fix}"
                    )
                con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
                yield con
                con.execute("COMMIT")
                con.execute("CHECKPOINT")
            except BaseException:
                with contextlib.suppress(duckdb.Error):  # nothing to roll back if BEGIN itself failed
                    con.execute("ROLLBACK")
                raise
    except duckdb.Error as exc:  # a full disk, a read-only folder or a damaged file, named
        database_failure(database, exc, fix)


def _merge(database: Path, root: Path, manifests: list[Path], files: list[Path], fresh: bool = False) -> int:
    """Every manifest and every shard not yet in ``database`` merged into it, in one transaction; how many
    shard files were new. ``fresh``: ``database`` is an empty file to build anew."""
    shard_root = root / "shards"
    if fresh:
        database.unlink()  # DuckDB creates its file itself
    fix = f"The shards are the source of truth; rebuild it from them: `kvbench ingest --rebuild --out {root}`"
    with transaction(database, SCHEMA, fix) as con:
        done = dict(con.execute("SELECT path, fingerprint FROM ingested_files").fetchall())
        seen = {os.path.relpath(f, root): _fingerprint(f) for f in files}
        new = {path: print_ for path, print_ in seen.items() if done.get(path) != print_}
        # each manifest and new shard is read once, and every one that does not read back is named
        read, bad = [], []
        for manifest in manifests:
            try:
                read.append(RunManifest.read(manifest))
            except SpecError as exc:  # names the file and what is wrong
                bad.append(str(exc))
        tables = []
        for path in new:
            shard = read_shard(root / path)
            if isinstance(shard, str):
                bad.append(f"{root / path}: {shard}")
            else:
                tables.append(shard)
        if bad:
            raise PrerequisiteError(
                f"{len(bad)} result file(s) under {shard_root} are damaged; nothing was ingested:\n  "
                + "\n  ".join(bad)
                + "\nDelete (or move away) each damaged shard and run the same `kvbench run` again: it "
                "computes exactly the missing problems. A damaged manifest.json is rewritten by that run."
            )
        insert_rows(con, "runs", run_table(read), "INSERT OR IGNORE")
        if new:
            # a shard replaced by `kvbench grade` replaces its rows: same keys, new verdicts; a shard of
            # an older schema is upgraded as it is read
            insert_rows(con, "samples", pa.concat_tables(tables), "INSERT OR REPLACE")
            con.executemany("INSERT OR REPLACE INTO ingested_files VALUES (?, ?)", list(new.items()))
        _ingest_bench(con, root)
        _ingest_analyses(con, root)
    return len(new)


def ingest(root: Path, *, rebuild: bool = False) -> IngestReport:
    """Merge every shard under ``root/shards`` into ``root/kvbench.duckdb`` and publish a snapshot.

    Every manifest and new shard is read back before anything is written, and everything is written in
    one transaction: a damaged file is named with what to do, and the database is left as it was.
    ``rebuild`` builds a new database from every shard (shards of older schemas upgraded as they are
    read) beside the old one, which it replaces only once the new one is complete.
    """
    shard_root = root / "shards"
    database = root / DATABASE
    with publishing(database) as snapshot:
        manifests = sorted(shard_root.glob("*/manifest.json")) if shard_root.is_dir() else []
        files = sorted(shard_root.glob("*/*.parquet")) if shard_root.is_dir() else []
        if rebuild:  # a new database from every shard, which replaces the old one only once complete
            new: list[int] = []
            atomic_write(database, lambda temp: new.append(_merge(temp, root, manifests, files, fresh=True)))
        else:
            new = [_merge(database, root, manifests, files)]
    return IngestReport(runs=len(manifests), files=new[0], database=database, snapshot=snapshot)

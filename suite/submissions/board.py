"""The leaderboard database's side of submissions: one write at a time, and the folder that is its
source of truth.

Each write is one transaction under the ingest's writer lock, followed by a fresh read-only snapshot
beside the database, which is what the app serves. A board's first write builds the file beside its
name and moves it there only once it committed: a failed first write leaves no half-made board.

The source of truth is the ``submissions/`` folder beside the database, as a results folder's is its
shards: each accepted bundle as ``<sha256>.tar.gz``, its record as ``<sha256>.json`` (who accepted it
and when, its withdrawal, each run's state), rewritten with every write, and the runs the operator
re-computed under ``<sha256>.recomputed/`` (kvbench.submissions.rebuild makes the database anew from
them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import duckdb

from kvbench.errors import PrerequisiteError, StorageError
from kvbench.store.atomic import atomic_write
from kvbench.store.board_tables import SUBMISSION_RUN_COLUMNS, SUBMISSION_TABLES, scoped, tables
from kvbench.store.ingest import SCHEMA, publishing, reading, transaction

SUBMISSION_COLUMNS = (
    "bundle_sha256", "submitter", "description", "created", "accepted_at", "accepted_by",
    "kvbench_version", "withdrawn_at", "withdrawn_reason",
)  # fmt: skip
"""The ``submissions`` table's columns, as a record names them."""

KEPT = "submissions"
"""The folder beside the board's database holding each accepted bundle, its record and its runs as the
operator re-computed them."""

MIN_PREFIX = 8
"""The fewest hex digits that name a submission."""


def kept_bundle(database: Path, sha256: str) -> Path:
    return database.parent / KEPT / f"{sha256}.tar.gz"


def recomputed_folder(database: Path, sha256: str) -> Path:
    """Where `kvbench verify --db` computes a submission's runs (shards/<run>/, as `kvbench run`'s
    ``--out``): kept, so that an interrupted re-computation resumes and a rebuild reads them back."""
    return database.parent / KEPT / f"{sha256}.recomputed"


@contextmanager
def writing(database: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """One write to the board, its records rewritten before it commits, then its snapshot published. A
    file that cannot be written is a StorageError naming it; the board is then as it was."""
    try:
        with publishing(database), _transaction(database) as con:
            yield con
            keep_records(con, database.parent / KEPT)
    except OSError as exc:
        where = os.fsdecode(exc.filename) if exc.filename is not None else database
        raise StorageError(
            f"cannot write the board {database}: {exc.strerror or exc} ({where}); nothing was written"
        ) from exc


@contextmanager
def _transaction(database: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A transaction on the board; on a board's first write, on a file beside it that takes its name
    only once the transaction committed."""
    fix = f"Rebuild it from the bundles it accepted: `kvbench accept --rebuild --db {database}`"
    if database.exists():
        with transaction(database, SCHEMA + SUBMISSION_TABLES, fix) as con:
            if not scoped(con):
                raise PrerequisiteError(
                    f"{database} was written by an earlier kvbench, which published submitted runs "
                    f"without re-computing them; this one publishes only what it re-computed. {fix}"
                )
            yield con
        return
    fresh = database.with_name(f".{database.name}.new")
    fresh.unlink(missing_ok=True)
    try:
        with transaction(fresh, SCHEMA + SUBMISSION_TABLES, fix) as con:
            yield con
        os.replace(fresh, database)
    finally:
        fresh.unlink(missing_ok=True)
        fresh.with_name(fresh.name + ".wal").unlink(missing_ok=True)


def keep_records(con: duckdb.DuckDBPyConnection, folder: Path) -> None:
    """Every submission's record (its row and its runs' states) as ``<sha256>.json`` in ``folder``,
    written before the transaction commits: a record the database does not hold yet is one the operator
    asked for, which a rebuild carries out."""
    found = con.execute(f"SELECT {', '.join(SUBMISSION_COLUMNS)} FROM submissions ORDER BY accepted_at")
    for row in found.fetchall():
        record = dict(zip(SUBMISSION_COLUMNS, row, strict=True))
        record["runs"] = con.execute(
            f"SELECT {', '.join(SUBMISSION_RUN_COLUMNS)} FROM submission_runs WHERE bundle_sha256 = ? "
            "ORDER BY identity",
            [record["bundle_sha256"]],
        ).fetchall()
        text = json.dumps(record, indent=1, default=str)
        path = folder / f"{record['bundle_sha256']}.json"
        if not path.is_file() or path.read_text() != text:
            atomic_write(path, partial(Path.write_text, data=text))


def find_submission(database: Path, prefix: str) -> tuple[str, float | None]:
    """The sha256 of the one submission whose digest starts with ``prefix``, and when it was withdrawn."""
    if not database.is_file():
        raise PrerequisiteError(f"no database {database}")
    with reading(database) as con:
        return found_submission(con, database, prefix)


def found_submission(con: duckdb.DuckDBPyConnection, database: Path, prefix: str) -> tuple[str, float | None]:
    """:func:`find_submission` on an open board."""
    if len(prefix) < MIN_PREFIX:
        raise PrerequisiteError(
            f"give at least {MIN_PREFIX} hex digits of the bundle's sha256, not {prefix!r}"
        )
    found = (
        con.execute(
            "SELECT bundle_sha256, withdrawn_at FROM submissions WHERE starts_with(bundle_sha256, ?)",
            [prefix],
        ).fetchall()
        if "submissions" in tables(con)
        else []
    )
    if len(found) != 1:
        raise PrerequisiteError(f"{len(found)} submissions in {database} have a digest starting {prefix!r}")
    return found[0]

"""The leaderboard database's side of submissions: accepting a checked bundle, withdrawing it, and
recording what `kvbench verify` found. Each write is one transaction under the ingest's writer lock, and
is followed by a fresh read-only snapshot beside the database, which is what the app serves."""

from __future__ import annotations

import getpass
import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from kvbench.errors import PrerequisiteError
from kvbench.results.check import outputs_digest
from kvbench.store.atomic import atomic_write
from kvbench.store.ingest import SCHEMA, snapshot_of, transaction, writer_lock
from kvbench.store.records import RunRecord, arrow_schema
from kvbench.submissions.contents import arrow_rows
from kvbench.submissions.rules import Checked

SUBMISSION_TABLES = """
CREATE TABLE IF NOT EXISTS submissions (
    bundle_sha256 VARCHAR PRIMARY KEY, submitter VARCHAR, description VARCHAR, created DOUBLE,
    accepted_at DOUBLE, accepted_by VARCHAR, kvbench_version VARCHAR,
    withdrawn_at DOUBLE, withdrawn_reason VARCHAR
);
CREATE TABLE IF NOT EXISTS submission_runs (
    bundle_sha256 VARCHAR, run_id VARCHAR, added BOOLEAN, PRIMARY KEY (bundle_sha256, run_id)
);
CREATE TABLE IF NOT EXISTS verifications (
    bundle_sha256 VARCHAR, run_id VARCHAR, outcome VARCHAR, method VARCHAR, problems INTEGER,
    machine JSON, verified_at DOUBLE, detail VARCHAR
);
"""
"""``added``: the submission brought the run (it was not stored before), so withdrawing may remove it."""


@contextmanager
def _writing(database: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    with writer_lock(database.parent):
        with transaction(database, SCHEMA + SUBMISSION_TABLES, "rebuild it first") as con:
            yield con
        atomic_write(snapshot_of(database), lambda temp: shutil.copyfile(database, temp))


@dataclass(frozen=True)
class Accepted:
    sha256: str
    runs: int
    added: int
    samples: int
    snapshot: Path


def accept(bundle: Path, sha256: str, checked: Checked, database: Path, accepted_by: str | None) -> Accepted:
    """Write a bundle that passed every rule: its runs and samples, and who sent it, who accepted it and
    when. A run already stored must hold the same outputs; the bundle file is kept beside the database."""
    assert not checked.failures and checked.samples is not None
    manifest = checked.manifest
    with _writing(database) as con:
        known = con.execute(
            "SELECT withdrawn_at FROM submissions WHERE bundle_sha256 = ?", [sha256]
        ).fetchone()
        if known is not None:
            state = "withdrawn" if known[0] is not None else "accepted"
            raise PrerequisiteError(
                f"bundle {sha256[:16]} was already {state} in {database}; nothing written"
            )
        stored = {r[0] for r in con.execute("SELECT DISTINCT run_id FROM runs").fetchall()}
        ids = [run.run_id for run in checked.runs]
        # the same runs exported again make another bundle: a withdrawal covers the runs, not just the file
        withdrawn = con.execute(
            """SELECT run_id, bundle_sha256 FROM submission_runs JOIN submissions USING (bundle_sha256)
               WHERE withdrawn_at IS NOT NULL AND list_contains(?, run_id)
               AND run_id NOT IN (SELECT run_id FROM submission_runs JOIN submissions USING (bundle_sha256)
                                  WHERE withdrawn_at IS NULL)""",
            [ids],
        ).fetchall()
        if withdrawn:
            run_id, held_by = withdrawn[0]
            raise PrerequisiteError(
                f"run {run_id} (and {len(withdrawn) - 1} more) was withdrawn with submission "
                f"{held_by[:16]}; nothing written"
            )
        clashes = [
            f"run {run_id}: stored with outputs {outputs_digest(con, run_id)}, the bundle's are "
            f"{outputs_digest(checked.samples, run_id)}"
            for run_id in ids
            if run_id in stored and outputs_digest(con, run_id) != outputs_digest(checked.samples, run_id)
        ]
        if clashes:
            raise PrerequisiteError(
                "runs with the same identity but other outputs; nothing written:\n  " + "\n  ".join(clashes)
            )
        new = [run for run in checked.runs if run.run_id not in stored]
        if new:
            rows = [RunRecord.from_manifest(run.manifest).row() for run in new]
            con.register("new_runs", pa.Table.from_pylist(rows, schema=arrow_schema(RunRecord)))
            con.execute("INSERT INTO runs BY NAME SELECT * FROM new_runs")
            samples = arrow_rows(
                checked.samples,
                "SELECT * FROM samples WHERE list_contains(?, run_id)",
                [[r.run_id for r in new]],
            )
            con.register("new_samples", samples)
            con.execute("INSERT INTO samples BY NAME SELECT * FROM new_samples")
        con.execute(
            "INSERT INTO submissions VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
            [
                sha256,
                manifest.get("submitter") or "",
                manifest.get("description") or "",
                manifest.get("created"),
                time.time(),
                accepted_by or getpass.getuser(),
                manifest.get("kvbench"),
            ],
        )
        con.executemany(
            "INSERT INTO submission_runs VALUES (?, ?, ?)", [[sha256, i, i not in stored] for i in ids]
        )
        count = checked.samples.execute("SELECT count(*) FROM samples").fetchone()
        kept = database.parent / "submissions" / f"{sha256}.tar.gz"
        kept.parent.mkdir(exist_ok=True)
        shutil.copyfile(bundle, kept)
    return Accepted(sha256, len(ids), len(new), count[0] if count else 0, snapshot_of(database))


MIN_PREFIX = 8
"""The fewest hex digits that name a submission."""


def find_submission(con: duckdb.DuckDBPyConnection, prefix: str) -> tuple[str, Any]:
    if len(prefix) < MIN_PREFIX:
        raise PrerequisiteError(
            f"give at least {MIN_PREFIX} hex digits of the bundle's sha256, not {prefix!r}"
        )
    found = con.execute(
        "SELECT bundle_sha256, withdrawn_at FROM submissions WHERE starts_with(bundle_sha256, ?)", [prefix]
    ).fetchall()
    if len(found) != 1:
        raise PrerequisiteError(
            f"{len(found)} submissions have a digest starting {prefix!r}: give more digits"
        )
    return found[0]


def withdraw(database: Path, prefix: str, reason: str) -> tuple[str, int]:
    """Mark a submission withdrawn and remove the runs it brought that no live submission still holds;
    the digest and the record of its acceptance stay."""
    if not database.is_file():
        raise PrerequisiteError(f"no database {database}")
    with _writing(database) as con:
        sha256, withdrawn_at = find_submission(con, prefix)
        if withdrawn_at is not None:
            raise PrerequisiteError(f"submission {sha256[:16]} is already withdrawn")
        con.execute(
            "UPDATE submissions SET withdrawn_at = ?, withdrawn_reason = ? WHERE bundle_sha256 = ?",
            [time.time(), reason, sha256],
        )
        gone = [
            r[0]
            for r in con.execute(
                """SELECT run_id FROM submission_runs mine WHERE bundle_sha256 = ?
                   AND EXISTS (SELECT 1 FROM submission_runs a WHERE a.run_id = mine.run_id AND a.added)
                   AND NOT EXISTS (SELECT 1 FROM submission_runs o JOIN submissions s USING (bundle_sha256)
                                   WHERE o.run_id = mine.run_id AND s.withdrawn_at IS NULL)""",
                [sha256],
            ).fetchall()
        ]
        con.execute("DELETE FROM samples WHERE list_contains(?, run_id)", [gone])
        con.execute("DELETE FROM runs WHERE list_contains(?, run_id)", [gone])
    return sha256, len(gone)


def live_submission(database: Path, sha256: str) -> bool:
    """Whether ``database`` holds the bundle as an accepted submission that is not withdrawn."""
    if not database.is_file():
        return False
    with duckdb.connect(str(database), read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if "submissions" not in tables:
            return False
        found = con.execute(
            "SELECT withdrawn_at FROM submissions WHERE bundle_sha256 = ?", [sha256]
        ).fetchone()
    return found is not None and found[0] is None


def record_verification(database: Path, sha256: str, outcomes: list[dict[str, Any]]) -> None:
    with _writing(database) as con:
        con.executemany(
            "INSERT INTO verifications VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                [
                    sha256,
                    o["run_id"],
                    o["outcome"],
                    o["method"],
                    o["problems"],
                    json.dumps(o["machine"]),
                    time.time(),
                    f"{o['detail']} (draw seed {o['seed']})",
                ]
                for o in outcomes
            ],
        )

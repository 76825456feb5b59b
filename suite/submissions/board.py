"""The leaderboard database's side of submissions: accepting a checked bundle, withdrawing it, and
recording what `kvbench verify` found. Each write is one transaction under the ingest's writer lock, and
is followed by a fresh read-only snapshot beside the database, which is what the app serves.

The board's source of truth is its ``submissions/`` folder beside the database, as a results folder's is
its shards: each accepted bundle as ``<sha256>.tar.gz`` and its record as ``<sha256>.json`` (who accepted
it and when, its withdrawal, its verifications), rewritten with every write. :func:`rebuild` makes the
database anew from them.
"""

from __future__ import annotations

import getpass
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from kvbench.errors import PrerequisiteError
from kvbench.results.check import outputs_digest
from kvbench.store.atomic import atomic_write
from kvbench.store.board_tables import (
    CONFLICTS,
    NEWEST_VERIFICATIONS,
    SUBMISSION_TABLES,
    board_run_id,
    scoped,
    tables,
)
from kvbench.store.ingest import SCHEMA, insert_rows, publishing, reading, snapshot_of, transaction
from kvbench.store.records import run_table
from kvbench.submissions.bundle import open_bundle, sha256_file
from kvbench.submissions.contents import copy_samples, load_samples, stored_runs
from kvbench.submissions.rules import Checked

SUBMISSION_COLUMNS = (
    "bundle_sha256", "submitter", "description", "created", "accepted_at", "accepted_by",
    "kvbench_version", "withdrawn_at", "withdrawn_reason",
)  # fmt: skip
"""The ``submissions`` table's columns, as a record names them."""
VERIFICATION_COLUMNS = "bundle_sha256, run_id, outcome, method, problems, machine, verified_at, detail"
"""The ``verifications`` table's columns in the order a record lists each row's values: named in every
read and write, since a board made by an earlier kvbench may hold them in another order."""
INSERT_VERIFICATION = f"INSERT INTO verifications ({VERIFICATION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"


KEPT = "submissions"
"""The folder beside the board's database holding each accepted bundle and its record."""


@contextmanager
def _writing(database: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    fix = f"Rebuild it from the bundles it accepted: `kvbench accept --rebuild --db {database}`"
    with publishing(database), transaction(database, SCHEMA + SUBMISSION_TABLES, fix) as con:
        if not scoped(con):
            raise PrerequisiteError(
                f"{database} was written by an earlier kvbench, which stored each run once for every "
                f"submission holding it; this one keeps each submission's runs apart. {fix}"
            )
        yield con
        _keep_records(con, database.parent / KEPT)


def _keep_records(con: duckdb.DuckDBPyConnection, folder: Path) -> None:
    """Every submission's record (its row and its verifications) as ``<sha256>.json`` in ``folder``,
    written before the transaction commits: a record the database does not hold yet is one the maintainer
    asked for, which a rebuild carries out."""
    found = con.execute("SELECT * FROM submissions ORDER BY accepted_at")
    names = [d[0] for d in found.description]
    for row in found.fetchall():
        record = dict(zip(names, row, strict=True))
        record["verifications"] = con.execute(
            f"SELECT {VERIFICATION_COLUMNS} FROM verifications WHERE bundle_sha256 = ? "
            "ORDER BY verified_at, run_id",
            [record["bundle_sha256"]],
        ).fetchall()
        text = json.dumps(record, indent=1)
        path = folder / f"{record['bundle_sha256']}.json"
        if not path.is_file() or path.read_text() != text:
            atomic_write(path, partial(Path.write_text, data=text))


@dataclass(frozen=True)
class Accepted:
    sha256: str
    runs: int
    samples: int
    snapshot: Path
    conflicts: list[str]
    """One line per run of the bundle that a live submission holds with other outputs on the same output
    environment: `kvbench verify` of both decides which counts."""


def accept(bundle: Path, sha256: str, checked: Checked, database: Path, accepted_by: str | None) -> Accepted:
    """Write a bundle that passed every rule: its runs and samples, under the board's own run ids, and who
    sent it, who accepted it and when. Runs of the same identity from other submissions stay as they
    are; the bundle file is kept beside the database."""
    assert not checked.failures and checked.samples is not None
    manifest = checked.manifest
    assert manifest is not None
    submission = {
        "bundle_sha256": sha256,
        "submitter": manifest.submitter,
        "description": manifest.description,
        "created": manifest.created,
        "accepted_at": time.time(),
        "accepted_by": accepted_by or getpass.getuser(),
        "kvbench_version": manifest.kvbench,
        "withdrawn_at": None,
        "withdrawn_reason": None,
    }
    with _writing(database) as con:
        known = con.execute(
            "SELECT withdrawn_at FROM submissions WHERE bundle_sha256 = ?", [sha256]
        ).fetchone()
        if known is not None:
            state = "withdrawn" if known[0] is not None else "accepted"
            raise PrerequisiteError(
                f"bundle {sha256[:16]} was already {state} in {database}; nothing written"
            )
        held = _held(checked, sha256)
        # the same runs exported again make another bundle: a withdrawal covers the runs, not just the file
        withdrawn = con.execute(
            """WITH held AS (SELECT identity || '/' || outputs AS result, identity, bundle_sha256,
                                    withdrawn_at IS NULL AS live
                             FROM submission_runs JOIN submissions USING (bundle_sha256))
               SELECT identity, bundle_sha256 FROM held WHERE NOT live AND list_contains(?, result)
               AND result NOT IN (SELECT result FROM held WHERE live)""",
            [[f"{h['identity']}/{h['outputs']}" for h in held]],
        ).fetchall()
        if withdrawn:
            identity, held_by = withdrawn[0]
            raise PrerequisiteError(
                f"run {identity} (and {len(withdrawn) - 1} more) was withdrawn with submission "
                f"{held_by[:16]}, with the same outputs; nothing written"
            )
        _store(con, checked, submission, held)
        conflicts = [
            f"run {identity} ({label}): submission {first[:16]} holds outputs {first_outputs}, "
            f"{second[:16]} holds {second_outputs}, both recorded on one output environment"
            for identity, label, first, first_outputs, second, second_outputs, *_ in con.execute(
                CONFLICTS, [sha256, sha256]
            ).fetchall()
        ]
        count = checked.samples.execute("SELECT count(*) FROM samples").fetchone()
        kept = database.parent / KEPT / f"{sha256}.tar.gz"
        atomic_write(kept, lambda temp: shutil.copyfile(bundle, temp))
    return Accepted(sha256, len(held), count[0] if count else 0, snapshot_of(database), conflicts)


def _held(checked: Checked, sha256: str) -> list[dict[str, Any]]:
    """A checked bundle's runs as ``submission_runs`` rows."""
    assert checked.samples is not None
    return [
        {
            "bundle_sha256": sha256,
            "identity": run.run_id,
            "run_id": board_run_id(run.run_id, sha256),
            "label": run.manifest.label or run.run_id,
            "outputs": outputs_digest(checked.samples, run.run_id),
            "environment": json.dumps(run.manifest.output_environment(), sort_keys=True),
        }
        for run in checked.runs
    ]


def _store(
    con: duckdb.DuckDBPyConnection,
    checked: Checked,
    submission: dict[str, Any] | None,
    held: list[dict[str, Any]],
) -> None:
    """The ``held`` runs of a checked bundle and their samples, under their board run ids; with
    ``submission``, also its ``submissions`` row and its ``submission_runs`` rows."""
    assert checked.samples is not None
    manifests = {run.run_id: run.manifest for run in checked.runs}
    if held:
        renamed = (manifests[h["identity"]].model_copy(update={"run_id": h["run_id"]}) for h in held)
        insert_rows(con, "runs", run_table(renamed))
    for h in held:
        copy_samples(checked.samples, con, "run_id = ?", [h["identity"]], run_id=h["run_id"])
    if submission is None:
        return
    # by name: a board made by an earlier kvbench may hold its columns in another order
    insert_rows(con, "submissions", pa.Table.from_pylist([submission]))
    if held:
        insert_rows(con, "submission_runs", pa.Table.from_pylist(held))


MIN_PREFIX = 8
"""The fewest hex digits that name a submission."""


def withdraw(database: Path, prefix: str, reason: str) -> tuple[str, int]:
    """Mark the submission whose sha256 starts with ``prefix`` withdrawn and remove the runs it brought that
    no live submission still holds; the digest and the record of its acceptance stay."""
    if not database.is_file():
        raise PrerequisiteError(f"no database {database}")
    if len(prefix) < MIN_PREFIX:
        raise PrerequisiteError(
            f"give at least {MIN_PREFIX} hex digits of the bundle's sha256, not {prefix!r}"
        )
    with _writing(database) as con:
        found = con.execute(
            "SELECT bundle_sha256, withdrawn_at FROM submissions WHERE starts_with(bundle_sha256, ?)",
            [prefix],
        ).fetchall()
        if len(found) != 1:
            raise PrerequisiteError(
                f"{len(found)} submissions have a digest starting {prefix!r}: give more digits"
            )
        sha256, withdrawn_at = found[0]
        if withdrawn_at is not None:
            raise PrerequisiteError(f"submission {sha256[:16]} is already withdrawn")
        gone = _withdraw(con, sha256, time.time(), reason)
    return sha256, len(gone)


def _withdraw(con: duckdb.DuckDBPyConnection, sha256: str, when: float, reason: str) -> list[str]:
    """Mark a submission withdrawn and remove its runs (each submission's runs are its own); the runs
    removed."""
    con.execute(
        "UPDATE submissions SET withdrawn_at = ?, withdrawn_reason = ? WHERE bundle_sha256 = ?",
        [when, reason, sha256],
    )
    return _remove(con, "bundle_sha256 = ?", [sha256])


def _remove(con: duckdb.DuckDBPyConnection, where: str, params: list[Any]) -> list[str]:
    """The board runs of the ``submission_runs`` rows matching ``where`` (kvbench's own SQL, bound
    ``params``) taken out of runs and samples; those that were there."""
    gone = [
        r[0]
        for r in con.execute(
            f"SELECT run_id FROM submission_runs WHERE {where} AND run_id IN (SELECT run_id FROM runs) "
            "ORDER BY run_id",
            params,
        ).fetchall()
    ]
    con.execute("DELETE FROM samples WHERE list_contains(?, run_id)", [gone])
    con.execute("DELETE FROM runs WHERE list_contains(?, run_id)", [gone])
    return gone


def live_submission(database: Path, sha256: str) -> bool:
    """Whether ``database`` holds the bundle as an accepted submission that is not withdrawn."""
    if not database.is_file():
        return False
    with reading(database) as con:
        if "submissions" not in tables(con):
            return False
        found = con.execute(
            "SELECT withdrawn_at FROM submissions WHERE bundle_sha256 = ?", [sha256]
        ).fetchone()
    return found is not None and found[0] is None


def record_verification(database: Path, sha256: str, outcomes: list[dict[str, Any]]) -> list[str]:
    """Record what `kvbench verify` found for a submission's runs. A run whose newest verification failed
    stops counting at once: it is taken off the board's runs and samples (its record stays, and the
    page names it), and comes back from the kept bundle if a later verification passes. The board runs
    taken off."""
    with _writing(database) as con:
        con.executemany(
            INSERT_VERIFICATION,
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
        gone = _remove_failed(con, sha256)
        _restore_passed(con, database.parent / KEPT, sha256)
    return gone


_NEWEST_FAILED = f"""bundle_sha256 = ? AND identity IN (
    SELECT identity FROM {NEWEST_VERIFICATIONS} WHERE bundle_sha256 = ? AND outcome = 'failed')"""


def _remove_failed(con: duckdb.DuckDBPyConnection, sha256: str) -> list[str]:
    """The submission's board runs whose newest verification failed, taken off runs and samples."""
    return _remove(con, _NEWEST_FAILED, [sha256, sha256])


def _restore_passed(con: duckdb.DuckDBPyConnection, folder: Path, sha256: str) -> None:
    """A live submission's runs that are off the board although their newest verification did not fail
    (a later one passed), stored again from its kept bundle."""
    missing = con.execute(
        f"""SELECT identity FROM submission_runs JOIN submissions USING (bundle_sha256)
            WHERE bundle_sha256 = ? AND withdrawn_at IS NULL AND run_id NOT IN (SELECT run_id FROM runs)
            AND NOT ({_NEWEST_FAILED})""",
        [sha256, sha256, sha256],
    ).fetchall()
    if missing:
        with _kept(folder / f"{sha256}.tar.gz") as checked:
            wanted = {r[0] for r in missing}
            _store(con, checked, None, [h for h in _held(checked, sha256) if h["identity"] in wanted])


@dataclass(frozen=True)
class Rebuilt:
    submissions: int
    withdrawn: int
    runs: int
    snapshot: Path


def rebuild(database: Path) -> Rebuilt:
    """The board's database made anew from ``submissions/`` beside it: each kept bundle (whose sha256
    must still be its name) stored as it was accepted, in the order it was, then the withdrawals and the
    verifications its record holds. Built beside the old file, which it replaces only once complete."""
    folder = database.parent / KEPT
    with publishing(database) as snapshot:
        records = _records(folder)
        runs: list[int] = []
        atomic_write(database, lambda temp: runs.append(_replay(temp, folder, records)))
    withdrawn = sum(r["withdrawn_at"] is not None for r in records)
    return Rebuilt(len(records), withdrawn, runs[0], snapshot)


def _records(folder: Path) -> list[dict[str, Any]]:
    """Every kept submission's record, in the order they were accepted; a bundle without its record (or
    a record without its bundle) is named."""
    bundles = {p.name.removesuffix(".tar.gz") for p in folder.glob("*.tar.gz")}
    paths = {p.stem: p for p in folder.glob("*.json")}
    unmatched = sorted(
        [
            f"{folder / name}.tar.gz: no record {name}.json beside it (accepted before kvbench kept "
            "records?): move it away, rebuild, then accept it again unless it was withdrawn"
            for name in bundles - set(paths)
        ]
        + [f"{paths[name]}: no bundle {name}.tar.gz beside it" for name in set(paths) - bundles]
    )
    records, bad = [], []
    for name in sorted(set(paths) & bundles):
        try:
            record = json.loads(paths[name].read_text())
            if not isinstance(record, dict) or record.get("bundle_sha256") != name:
                raise ValueError(f"not the record of submission {name}")
            missing = [k for k in SUBMISSION_COLUMNS if k not in record]
            if missing:
                raise ValueError(f"lacks {', '.join(missing)}")
            records.append(record)
        except (OSError, ValueError) as exc:
            bad.append(f"{paths[name]}: {exc}")
    if unmatched or bad or not bundles:
        raise PrerequisiteError(
            f"cannot rebuild from {folder}: "
            + ("\n  " + "\n  ".join(unmatched + bad) if unmatched or bad else "it holds no accepted bundle")
            + "\nEach accepted bundle is kept there as <sha256>.tar.gz with its record <sha256>.json."
        )
    return sorted(records, key=lambda r: (r["accepted_at"], r["bundle_sha256"]))


def _replay(temp: Path, folder: Path, records: list[dict[str, Any]]) -> int:
    """Every record's bundle, withdrawal and verifications into the new database ``temp``; its runs."""
    temp.unlink()  # DuckDB creates its file itself
    with transaction(temp, SCHEMA + SUBMISSION_TABLES, "build it again") as con:
        for record in records:
            sha256 = record["bundle_sha256"]
            with _kept(folder / f"{sha256}.tar.gz") as checked:
                _store(con, checked, {k: record[k] for k in SUBMISSION_COLUMNS}, _held(checked, sha256))
        for record in sorted(
            (r for r in records if r["withdrawn_at"] is not None), key=lambda r: r["withdrawn_at"]
        ):
            _withdraw(con, record["bundle_sha256"], record["withdrawn_at"], record["withdrawn_reason"])
        rows = [row for r in records for row in r["verifications"]]
        if rows:
            con.executemany(INSERT_VERIFICATION, rows)
        for record in records:
            _remove_failed(con, record["bundle_sha256"])
        count = con.execute("SELECT count(*) FROM runs").fetchone()
    return count[0] if count else 0


@contextmanager
def _kept(bundle: Path) -> Iterator[Checked]:
    """A kept bundle's runs and samples. Its rules were checked when it was accepted, and its sha256 is
    still its name, so it is read as it is: a rebuild keeps what a later kvbench's rules would refuse."""
    if sha256_file(bundle) != bundle.name.removesuffix(".tar.gz"):
        raise PrerequisiteError(
            f"{bundle}: its sha256 is not its name, so it is not the bundle that was accepted; restore it "
            "from a backup (the board cannot be rebuilt without it)"
        )
    with tempfile.TemporaryDirectory() as scratch:
        failures = open_bundle(bundle, Path(scratch))
        runs, broken = stored_runs(Path(scratch) / "runs")
        samples, bad = load_samples(runs)
        with samples:
            problems = [str(f) for f in failures] + [f"runs/{b}: {why}" for b, why in broken.items()]
            problems += [f"{path}: {why}" for path, _, why in bad]
            if problems:
                raise PrerequisiteError(f"{bundle} no longer reads back: " + "; ".join(problems))
            yield Checked(None, runs=runs, samples=samples)

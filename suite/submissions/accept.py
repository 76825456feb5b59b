"""Accepting a bundle that passed every rule: its submission is recorded and its runs wait, *pending*,
for the operator to re-compute them (kvbench.submissions.recompute). Nothing of it is ranked, compared
or charted before then: accept writes no run and no sample."""

from __future__ import annotations

import getpass
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from kvbench.errors import PrerequisiteError
from kvbench.results.check import outputs_digest
from kvbench.store.atomic import atomic_write
from kvbench.store.board_tables import PENDING, SUBMISSION_RUN_COLUMNS, board_run_id
from kvbench.store.ingest import insert_rows, snapshot_of
from kvbench.submissions.board import kept_bundle, writing
from kvbench.submissions.rules import Checked


@dataclass(frozen=True)
class Accepted:
    sha256: str
    runs: int
    samples: int
    snapshot: Path


def accept(bundle: Path, sha256: str, checked: Checked, database: Path, accepted_by: str | None) -> Accepted:
    """Record a bundle that passed every rule as a submission whose runs are pending, and keep the
    bundle file beside the database. Another submission's rows are never read or changed."""
    assert not checked.failures and checked.samples is not None and checked.manifest is not None
    manifest = checked.manifest
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
    with writing(database) as con:
        known = con.execute(
            "SELECT withdrawn_at FROM submissions WHERE bundle_sha256 = ?", [sha256]
        ).fetchone()
        if known is not None:
            state = "withdrawn" if known[0] is not None else "accepted"
            raise PrerequisiteError(
                f"bundle {sha256[:16]} was already {state} in {database}; nothing written"
            )
        insert_rows(con, "submissions", pa.Table.from_pylist([submission]))
        insert_rows(con, "submission_runs", pa.Table.from_pylist(pending_runs(checked, sha256)))
        count = checked.samples.execute("SELECT count(*) FROM samples").fetchone()
        atomic_write(kept_bundle(database, sha256), lambda temp: shutil.copyfile(bundle, temp))
    return Accepted(sha256, len(checked.runs), count[0] if count else 0, snapshot_of(database))


def pending_runs(checked: Checked, sha256: str) -> list[dict]:
    """A checked bundle's runs as ``submission_runs`` rows waiting for re-computation."""
    assert checked.samples is not None
    empty = dict.fromkeys(SUBMISSION_RUN_COLUMNS)
    return [
        empty
        | {
            "bundle_sha256": sha256,
            "identity": run.run_id,
            "run_id": board_run_id(run.run_id, sha256),
            "label": run.manifest.label or run.run_id,
            "claimed_outputs": outputs_digest(checked.samples, run.run_id),
            "state": PENDING,
        }
        for run in checked.runs
    ]

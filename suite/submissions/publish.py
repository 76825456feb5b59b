"""Publishing what the operator re-computed: a run computed whole here enters the board's runs and
samples under its board run id, with this machine's manifest and samples (the submitter's claim stays
in the kept bundle); a run that could not be computed is marked failed, with the reason, and never
enters them. A run already failed stays failed unless it was computed again whole."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import duckdb

from kvbench.errors import KvbenchError
from kvbench.printable import printable
from kvbench.store.board_tables import FAILED, PENDING, PUBLISHED
from kvbench.store.ingest import insert_rows
from kvbench.store.records import run_table
from kvbench.submissions.board import recomputed_folder, writing
from kvbench.submissions.contents import copy_samples, load_samples, stored_runs
from kvbench.submissions.recompute import FAILED as NOT_COMPUTED
from kvbench.submissions.recompute import RECOMPUTED, Outcome


def awaiting(con: duckdb.DuckDBPyConnection, sha256: str, retry: bool) -> dict[str, str]:
    """A submission's runs still to compute, identity -> state: the pending ones, and with ``retry`` the
    failed ones (computed again whole)."""
    states = (PENDING, FAILED) if retry else (PENDING,)
    return dict(
        con.execute(
            "SELECT identity, state FROM submission_runs WHERE bundle_sha256 = ? AND list_contains(?, state)",
            [sha256, list(states)],
        ).fetchall()
    )


def record(database: Path, sha256: str, outcomes: Sequence[Outcome]) -> list[str]:
    """Each outcome's run published (re-computed whole) or failed (with why); the board runs published."""
    folder = recomputed_folder(database, sha256)
    published = []
    with writing(database) as con:
        withdrawn = con.execute("SELECT withdrawn_at FROM submissions WHERE bundle_sha256 = ?", [sha256])
        if withdrawn.fetchone() != (None,):  # withdrawn while it was being re-computed: nothing to publish
            return []
        for o in outcomes:
            if o.outcome not in (RECOMPUTED, NOT_COMPUTED):
                continue  # waiting on the operator: still pending
            state = PUBLISHED if o.outcome == RECOMPUTED else FAILED
            found = con.execute(
                "UPDATE submission_runs SET state = ?, reason = ?, computed_run = ?, outputs = ?, claim = ?, "
                "machine = ?, recomputed_at = ?, seconds = ? WHERE bundle_sha256 = ? AND identity = ? "
                "RETURNING run_id",
                [
                    state,
                    None if state == PUBLISHED else printable(o.detail, lines=True),  # a scorer's words
                    o.computed_run or None,
                    o.outputs or None,
                    o.claim or None,
                    json.dumps(o.machine),
                    time.time(),
                    o.seconds,
                    sha256,
                    o.run_id,
                ],
            ).fetchone()
            assert found is not None, f"run {o.run_id} is not one of submission {sha256[:16]}'s"
            board_id = found[0]
            if state == PUBLISHED:
                store(con, folder, o.computed_run, board_id)
                published.append(board_id)
    return published


def store(con: duckdb.DuckDBPyConnection, folder: Path, computed_run: str, board_id: str) -> None:
    """A run computed in ``folder`` (under ``computed_run``) stored in runs and samples as ``board_id``."""
    runs, broken = stored_runs(folder / "shards")
    found = [r for r in runs if r.run_id == computed_run]
    samples, bad = load_samples(found)
    with samples:
        if not found or bad or computed_run in broken:
            why = broken.get(computed_run) or bad or "no manifest"
            raise KvbenchError(
                f"{folder / 'shards' / computed_run}: the re-computed run does not read back ({why})"
            )
        con.execute("DELETE FROM samples WHERE run_id = ?", [board_id])
        con.execute("DELETE FROM runs WHERE run_id = ?", [board_id])
        insert_rows(con, "runs", run_table([found[0].manifest.model_copy(update={"run_id": board_id})]))
        copy_samples(samples, con, "run_id = ?", [computed_run], run_id=board_id)

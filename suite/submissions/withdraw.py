"""Withdrawing a submission: it is marked withdrawn (its record stays) and its published runs leave the
board. Nothing is keyed by outputs or identity across submissions: no withdrawal refuses, flags or
changes another submission's runs."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb

from kvbench.errors import PrerequisiteError
from kvbench.submissions.board import found_submission, writing


def withdraw(database: Path, prefix: str, reason: str) -> tuple[str, int]:
    """Withdraw the submission whose sha256 starts with ``prefix``; its digest and the board runs it took
    off."""
    if not database.is_file():
        raise PrerequisiteError(f"no database {database}")
    with writing(database) as con:
        sha256, withdrawn_at = found_submission(con, database, prefix)
        if withdrawn_at is not None:
            raise PrerequisiteError(f"submission {sha256[:16]} is already withdrawn")
        gone = take_off(con, sha256, time.time(), reason)
    return sha256, len(gone)


def take_off(con: duckdb.DuckDBPyConnection, sha256: str, when: float, reason: str) -> list[str]:
    """Mark a submission withdrawn and remove its runs from runs and samples; the board runs removed. A run
    another live submission also holds stays (none can, as each bundle's runs carry its whole digest)."""
    con.execute(
        "UPDATE submissions SET withdrawn_at = ?, withdrawn_reason = ? WHERE bundle_sha256 = ?",
        [when, reason, sha256],
    )
    gone = [
        r[0]
        for r in con.execute(
            "SELECT run_id FROM submission_runs WHERE bundle_sha256 = ? "
            "AND run_id IN (SELECT run_id FROM runs) AND run_id NOT IN (SELECT h.run_id "
            "FROM submission_runs h JOIN submissions s USING (bundle_sha256) "
            "WHERE h.bundle_sha256 <> ? AND s.withdrawn_at IS NULL) ORDER BY run_id",
            [sha256, sha256],
        ).fetchall()
    ]
    con.execute("DELETE FROM samples WHERE list_contains(?, run_id)", [gone])
    con.execute("DELETE FROM runs WHERE list_contains(?, run_id)", [gone])
    return gone

"""Who submitted the runs behind a row, and whether a maintainer's re-run confirmed them.

`kvbench accept` writes the tables ``submissions``, ``submission_runs`` and ``verifications`` into the
leaderboard database; a database of one's own runs has none of them, and its runs are *local*. A
withdrawn submission holds nothing. A run's verification is its newest one by a live submission.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import duckdb
import pandas as pd

from kvbench.leaderboard.display import MISSING
from kvbench.store.board_tables import CONFLICTS, NEWEST_VERIFICATIONS, scoped, tables

LOCAL = "local"
VERIFIED, NOT_VERIFIED, FAILED, CONFLICT = "verified", "not verified", "failed", "conflict"
IDENTICAL, PAIRED = "identical outputs", "paired scores"
"""The two checks `kvbench verify` makes: exact outputs on the machine the run recorded, or scores within
the run's interval elsewhere. A badge names the one a run passed."""
COLUMNS = ["run_id", "submitter", "bundle", "outcome", "method", "problems", "verified_on", "verified_at"]

_HELD = """
WITH live AS (SELECT bundle_sha256, submitter FROM submissions WHERE withdrawn_at IS NULL),
held AS (
    SELECT run_id, {identity} AS identity, bundle_sha256, submitter
    FROM submission_runs JOIN live USING (bundle_sha256)
    WHERE list_contains(?, run_id)
    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY bundle_sha256) = 1
)
SELECT run_id, submitter, bundle_sha256[:12] AS bundle, outcome, method, problems,
       -- the machine's CPU and GPU models only: its platform string names the kernel build
       concat_ws(' · ', machine->>'cpu',
                 CASE WHEN machine->>'gpu' IS NOT NULL THEN coalesce(machine->>'gpu_count', '1') || '× '
                      || (machine->>'gpu') END) AS verified_on,
       to_timestamp(verified_at) AS verified_at
FROM held LEFT JOIN {newest} newest USING (bundle_sha256, identity)
"""
_NO_VERIFICATIONS = (
    "(SELECT NULL::VARCHAR AS bundle_sha256, NULL::VARCHAR AS identity, NULL::VARCHAR AS outcome, "
    "NULL::VARCHAR AS method, NULL::INTEGER AS problems, NULL::JSON AS machine, NULL::DOUBLE AS verified_at)"
)


def held_runs(con: duckdb.DuckDBPyConnection, run_ids: Iterable[str]) -> pd.DataFrame:
    """One row per run a live submission holds (of ``run_ids``), with its newest verification."""
    ids = list(dict.fromkeys(run_ids))
    present = tables(con)
    if not {"submissions", "submission_runs"} <= present or not ids:
        return pd.DataFrame(columns=COLUMNS)
    newest = NEWEST_VERIFICATIONS if "verifications" in present else _NO_VERIFICATIONS
    # a board written before runs were scoped stored a run under its identity
    identity = "identity" if scoped(con) else "run_id"
    return con.execute(_HELD.format(identity=identity, newest=newest), [ids]).df()


def conflicts(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Runs of one identity that two submissions recorded on one output environment with other outputs
    (both still count until `kvbench verify` fails one): the cell, both submissions, and both board run
    ids (``first_run``, ``second_run``)."""
    if not scoped(con):
        return pd.DataFrame(columns=["cell", "first", "second", "first_run", "second_run"])
    found = con.execute(
        f"SELECT label AS cell, first[:12] AS first, second[:12] AS second, first_run, second_run "
        f"FROM ({CONFLICTS})",
        [None, None],
    )
    return found.df()


def failed_runs(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """The live submissions' runs whose newest verification failed: off every table, verdict and curve,
    named here so that the page can say so."""
    if not scoped(con) or "verifications" not in tables(con):
        return pd.DataFrame(columns=["cell", "submitter", "bundle", "failed_at", "detail"])
    found = con.execute(
        f"""SELECT r.label AS cell, s.submitter, r.bundle_sha256[:12] AS bundle,
                   to_timestamp(v.verified_at) AS failed_at, v.detail
            FROM submission_runs r JOIN submissions s USING (bundle_sha256)
            JOIN {NEWEST_VERIFICATIONS} v USING (bundle_sha256, identity)
            WHERE s.withdrawn_at IS NULL AND v.outcome = '{FAILED}'
            ORDER BY r.label, bundle"""
    )
    return found.df()


def conflicting_runs(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The board runs in a conflict (:func:`conflicts`): both sides."""
    found = conflicts(con)
    return {*found["first_run"], *found["second_run"]}


@dataclass(frozen=True)
class Notices:
    """What the page says above every table about the board's trust: runs of one identity that disagree
    on one machine, and runs that failed verification and no longer count."""

    conflicts: pd.DataFrame
    failed: pd.DataFrame


def notices(con: duckdb.DuckDBPyConnection) -> Notices:
    return Notices(conflicts(con).drop(columns=["first_run", "second_run"]), failed_runs(con))


def arm_badge(run_ids: Iterable[str], held: pd.DataFrame, conflicting: Iterable[str] = ()) -> tuple[str, str]:
    """(submission, verified) for an arm: its submitters, and ``verified (identical outputs)`` when every
    run's newest verification re-ran it to the same outputs, ``verified (paired scores)`` when every one
    verified it and one of them on another machine (its scores within their interval), ``failed`` when
    any failed, ``conflict`` when a run is in ``conflicting`` (another submission holds other outputs
    of it on the same machine) and unverified, ``not verified`` otherwise; an arm no live submission
    holds is ``local``, with nothing to verify."""
    rows = held.set_index("run_id").reindex(list(run_ids))
    if rows["submitter"].isna().all():
        return LOCAL, MISSING
    names = sorted({s or "anonymous" for s in rows["submitter"].dropna()})
    # a row can mix submitted runs with local ones (say, a full cache run here): both are named
    submitters = ", ".join(names + ([LOCAL] if rows["submitter"].isna().any() else []))
    outcomes = rows["outcome"]
    if (outcomes == FAILED).any():
        return submitters, FAILED
    if (outcomes == VERIFIED).all():
        method = IDENTICAL if (rows["method"] == IDENTICAL).all() else PAIRED
        return submitters, f"{VERIFIED} ({method})"
    if set(rows.index) & set(conflicting):
        return submitters, CONFLICT
    return submitters, NOT_VERIFIED

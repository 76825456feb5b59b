"""A leaderboard's tables beside runs and samples, and the one reading of which runs count.

`kvbench accept` (kvbench.submissions.accept) records a bundle as a submission whose runs are *pending*:
nothing of it enters ``runs`` or ``samples``. `kvbench verify` (kvbench.submissions.recompute)
re-computes each run whole on the operator's machine; a run re-computed whole is *published*: its
operator-computed manifest and samples are stored under a board run id of its own,
``<identity>-<bundle sha256>`` (:func:`board_run_id`), so that runs of one identity from two
submissions coexist and a comparison pairs a run only with runs of its own submission. A run that cannot
be re-computed here is *failed*, with the reason, and never stored. ``submission_runs`` holds each
submitted run's state, the digest of the outputs the submitter claimed and of those re-computed.

Every reader of a board reads runs through :func:`counted_runs`: a pending or failed run, or one of a
withdrawn submission, is in no relation a page or a comparison reads. A database of one's own runs has
none of these tables: its runs are local and all count.
"""

from __future__ import annotations

import duckdb

PENDING, PUBLISHED, FAILED = "pending", "published", "failed"
"""A submitted run's states: accepted and waiting for re-computation; re-computed whole here and on the
board; not re-computable here (its scorer failed, hung or broke a limit; a version the operator lacks),
never counted."""

MATCHES, DIFFERS = "matches", "differs"
"""Whether the outputs the operator re-computed are those the submitter claimed (the board shows the
re-computed ones either way)."""

SUBMISSION_TABLES = """
CREATE TABLE IF NOT EXISTS submissions (
    bundle_sha256 VARCHAR PRIMARY KEY, submitter VARCHAR, description VARCHAR, created DOUBLE,
    accepted_at DOUBLE, accepted_by VARCHAR, kvbench_version VARCHAR,
    withdrawn_at DOUBLE, withdrawn_reason VARCHAR
);
CREATE TABLE IF NOT EXISTS submission_runs (
    bundle_sha256 VARCHAR, identity VARCHAR, run_id VARCHAR, label VARCHAR, claimed_outputs VARCHAR,
    state VARCHAR, reason VARCHAR, computed_run VARCHAR, outputs VARCHAR, claim VARCHAR, machine JSON,
    recomputed_at DOUBLE, seconds DOUBLE, PRIMARY KEY (bundle_sha256, identity)
);
"""
"""``submission_runs.run_id`` is the board's run id, ``identity`` the run's as the bundle names it,
``computed_run`` the id its re-computation ran under (the identity, or another where the operator chose
another device or attention), ``machine`` the operator's hardware record."""

SUBMISSION_RUN_COLUMNS = (
    "bundle_sha256", "identity", "run_id", "label", "claimed_outputs", "state", "reason", "computed_run",
    "outputs", "claim", "machine", "recomputed_at", "seconds",
)  # fmt: skip
"""``submission_runs``' columns, in the order a kept record lists each row's values."""

LOCAL_SOURCE = ""
"""The source of a run no submission holds: one's own runs."""


def board_run_id(identity: str, bundle_sha256: str) -> str:
    """The id a submitted run is stored under on a board: its identity, then its bundle's whole sha256. A
    shortened digest lets a submitter make two bundles that share it (12 hex digits took 3.5 minutes of
    search on one core), and with it each other's runs."""
    return f"{identity}-{bundle_sha256}"


def tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The names of the database's tables."""
    return {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}


def scoped(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the database is a board this kvbench writes (each submitted run with its state); False for
    a database of one's own runs, and for a board written before submitted runs were re-computed."""
    return "submission_runs" in tables(con) and "state" in con.table("submission_runs").columns


def counted_runs(con: duckdb.DuckDBPyConnection) -> str:
    """SQL of the relation every reader of runs goes through: the ``runs`` rows that count, with a
    ``source`` column (the sha256 of the bundle whose re-computed run it is; LOCAL_SOURCE for one's own).
    On a board: the published runs of live submissions, and runs no submission holds. Kvbench's own SQL:
    no name or value from outside enters it."""
    if "submission_runs" not in tables(con):
        return f"(SELECT *, '{LOCAL_SOURCE}' AS source FROM runs)"
    if not scoped(con):  # an earlier board: its submitted runs were never re-computed, none counts
        return (
            f"(SELECT *, '{LOCAL_SOURCE}' AS source FROM runs WHERE run_id NOT IN "
            "(SELECT run_id FROM submission_runs))"
        )
    return f"""(SELECT runs.*, coalesce(held.bundle_sha256, '{LOCAL_SOURCE}') AS source FROM runs
        LEFT JOIN submission_runs held USING (run_id)
        LEFT JOIN submissions USING (bundle_sha256)
        WHERE held.run_id IS NULL OR (held.state = '{PUBLISHED}' AND submissions.withdrawn_at IS NULL))"""

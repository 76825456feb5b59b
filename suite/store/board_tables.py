"""A leaderboard's tables beside runs and samples, and the readings every layer shares: which submission
a stored run came from, and which runs of one identity disagree on one machine.

`kvbench accept` (kvbench.submissions.board) stores each bundle's runs under run ids of the board's own,
``<identity>-<bundle sha256, 12 digits>`` (:func:`board_run_id`): runs of one identity from two
submissions (two groups, two machines) coexist, each with its own samples, and a comparison pairs a run
only with runs of its own submission. ``submission_runs`` maps each board run to its submission, its
identity (the resolved spec's hash), the digest of its outputs and the output environment it recorded
(kvbench.store.manifest.Provenance.output_environment). A database of one's own runs has none of these
tables: its runs are local.
"""

from __future__ import annotations

import duckdb

SUBMISSION_TABLES = """
CREATE TABLE IF NOT EXISTS submissions (
    bundle_sha256 VARCHAR PRIMARY KEY, submitter VARCHAR, description VARCHAR, created DOUBLE,
    accepted_at DOUBLE, accepted_by VARCHAR, kvbench_version VARCHAR,
    withdrawn_at DOUBLE, withdrawn_reason VARCHAR
);
CREATE TABLE IF NOT EXISTS submission_runs (
    bundle_sha256 VARCHAR, identity VARCHAR, run_id VARCHAR, label VARCHAR, outputs VARCHAR,
    environment VARCHAR, PRIMARY KEY (bundle_sha256, identity)
);
CREATE TABLE IF NOT EXISTS verifications (
    bundle_sha256 VARCHAR, run_id VARCHAR, outcome VARCHAR, method VARCHAR, problems INTEGER,
    machine JSON, verified_at DOUBLE, detail VARCHAR
);
"""
"""``submission_runs.run_id`` is the board's run id; ``verifications.run_id`` the run's identity, as the
bundle and `kvbench verify` name it. ``environment`` is the output environment as sorted JSON text."""

LOCAL_SOURCE = ""
"""The source of a run no submission holds: one's own runs."""


def board_run_id(identity: str, bundle_sha256: str) -> str:
    """The id a submitted run is stored under on a board: its identity, then its bundle's."""
    return f"{identity}-{bundle_sha256[:12]}"


def tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The names of the database's tables."""
    return {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}


def scoped(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the database stores submitted runs under board run ids (a board written by this kvbench);
    False for a database of one's own runs, and for a board written before runs were scoped."""
    return "submission_runs" in tables(con) and "identity" in con.table("submission_runs").columns


def run_sources(con: duckdb.DuckDBPyConnection) -> str:
    """SQL of a relation (run_id, source): the sha256 of the bundle that brought each run; runs missing
    from it are local. Kvbench's own SQL: no name or value from outside enters it."""
    if "submission_runs" not in tables(con):
        return "(SELECT NULL::VARCHAR AS run_id, NULL::VARCHAR AS source WHERE false)"
    # a board written before runs were scoped may hold one run in two submissions: the first names it
    return "(SELECT run_id, min(bundle_sha256) AS source FROM submission_runs GROUP BY run_id)"


CONFLICTS = """
SELECT a.identity, a.label, a.bundle_sha256 AS first, a.outputs AS first_outputs,
       b.bundle_sha256 AS second, b.outputs AS second_outputs, a.run_id AS first_run, b.run_id AS second_run
FROM submission_runs a JOIN submission_runs b
  ON a.identity = b.identity AND a.environment = b.environment AND a.outputs <> b.outputs
     AND a.bundle_sha256 < b.bundle_sha256
WHERE a.run_id IN (SELECT run_id FROM runs) AND b.run_id IN (SELECT run_id FROM runs)
  AND (? IS NULL OR ? IN (a.bundle_sha256, b.bundle_sha256))
ORDER BY a.identity, first, second
"""
"""Pairs of counting runs (on the board: neither withdrawn nor failed, as both take a run off) of one
identity, recorded on the same output environment, whose outputs differ: one of them is not what that
spec gives there, and `kvbench verify` decides which. Bound: a bundle's sha256 to keep the pairs it
is in, or NULL twice."""

NEWEST_VERIFICATIONS = """
(SELECT bundle_sha256, run_id AS identity, outcome, method, problems, machine, verified_at, detail
 FROM verifications
 QUALIFY row_number() OVER (PARTITION BY bundle_sha256, run_id ORDER BY verified_at DESC NULLS LAST) = 1)
"""
"""Each submitted run's newest verification: the one that decides whether it counts (a run whose newest
verification failed is off the board's tables until a later one passes)."""

"""Who submitted the runs behind a row, and whether a maintainer's re-run confirmed them.

`kvbench accept` writes the tables ``submissions``, ``submission_runs`` and ``verifications`` into the
leaderboard database; a database of one's own runs has none of them, and its runs are *local*. A
withdrawn submission holds nothing. A run's verification is its newest one by a live submission.
"""

from __future__ import annotations

from collections.abc import Iterable

import duckdb
import pandas as pd

from kvbench.leaderboard.display import MISSING

LOCAL = "local"
VERIFIED, NOT_VERIFIED, FAILED = "verified", "not verified", "failed"
COLUMNS = ["run_id", "submitter", "bundle", "outcome", "method", "problems", "verified_on", "verified_at"]

_HELD = """
WITH live AS (SELECT bundle_sha256, submitter, accepted_at FROM submissions WHERE withdrawn_at IS NULL),
held AS (
    SELECT run_id, bundle_sha256, submitter FROM submission_runs JOIN live USING (bundle_sha256)
    WHERE list_contains(?, run_id)
    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY accepted_at, bundle_sha256) = 1
),
newest AS (
    SELECT run_id, outcome, method, problems, machine, verified_at FROM {verifications}
    WHERE list_contains(?, run_id) AND bundle_sha256 IN (SELECT bundle_sha256 FROM live)
    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY verified_at DESC NULLS LAST) = 1
)
SELECT run_id, submitter, bundle_sha256[:12] AS bundle, outcome, method, problems,
       -- the machine's CPU and GPU models only: its platform string names the kernel build
       concat_ws(' · ', machine->>'cpu',
                 CASE WHEN machine->>'gpu' IS NOT NULL THEN coalesce(machine->>'gpu_count', '1') || '× '
                      || (machine->>'gpu') END) AS verified_on,
       to_timestamp(verified_at) AS verified_at
FROM held LEFT JOIN newest USING (run_id)
"""
_NO_VERIFICATIONS = (
    "(SELECT NULL::VARCHAR AS bundle_sha256, NULL::VARCHAR AS run_id, NULL::VARCHAR AS outcome, "
    "NULL::VARCHAR AS method, NULL::INTEGER AS problems, NULL::JSON AS machine, NULL::DOUBLE AS verified_at)"
)


def held_runs(con: duckdb.DuckDBPyConnection, run_ids: Iterable[str]) -> pd.DataFrame:
    """One row per run a live submission holds (of ``run_ids``), with its newest verification."""
    ids = list(dict.fromkeys(run_ids))
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if not {"submissions", "submission_runs"} <= tables or not ids:
        return pd.DataFrame(columns=COLUMNS)
    verifications = "verifications" if "verifications" in tables else _NO_VERIFICATIONS
    return con.execute(_HELD.format(verifications=verifications), [ids, ids]).df()


def arm_badge(run_ids: Iterable[str], held: pd.DataFrame) -> tuple[str, str]:
    """(submission, verified) for an arm: its submitters, and ``verified`` when every run's newest
    verification verified it, ``failed`` when any failed, ``not verified`` otherwise; an arm no live
    submission holds is ``local``, with nothing to verify."""
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
        return submitters, VERIFIED
    return submitters, NOT_VERIFIED

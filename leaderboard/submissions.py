"""Who submitted the runs behind a row, and what the operator's re-computation found.

`kvbench accept` writes the tables ``submissions`` and ``submission_runs`` into the leaderboard database
(kvbench.store.board_tables); a database of one's own runs has none of them, and its runs are *local*.
Every number on a board is the operator's: a submitted run enters the tables the pages read only once
`kvbench verify` re-computed it whole (*published*). Until then its submission is listed as pending, with
no score; a run that could not be re-computed is listed as failed, with the reason; a withdrawn
submission holds nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import duckdb
import pandas as pd

from kvbench.leaderboard.display import MISSING
from kvbench.store.board_tables import DIFFERS, FAILED, MATCHES, PENDING, PUBLISHED, scoped

LOCAL = "local"
RECOMPUTED = "re-computed"
"""The badge of a published run: the operator computed every number of it."""
CLAIM_DIFFERED = f"{RECOMPUTED} (claim differed)"
"""A published run whose re-computed outputs are not the ones its bundle claimed: the board shows the
re-computed ones."""
COLUMNS = ["run_id", "submitter", "bundle", "claim", "recomputed_on", "recomputed_at"]

_HELD = f"""
SELECT run_id, submitter, bundle_sha256[:12] AS bundle, claim,
       -- the machine's CPU and GPU models only: its platform string names the kernel build
       concat_ws(' · ', machine->>'cpu',
                 CASE WHEN machine->>'gpu' IS NOT NULL THEN coalesce(machine->>'gpu_count', '1') || '× '
                      || (machine->>'gpu') END) AS recomputed_on,
       to_timestamp(recomputed_at) AS recomputed_at
FROM submission_runs JOIN submissions USING (bundle_sha256)
WHERE list_contains(?, run_id) AND withdrawn_at IS NULL AND state = '{PUBLISHED}'
"""


def held_runs(con: duckdb.DuckDBPyConnection, run_ids: Iterable[str]) -> pd.DataFrame:
    """One row per published run of a live submission (of ``run_ids``): who sent it, and where and when
    the operator re-computed it."""
    ids = list(dict.fromkeys(run_ids))
    if not scoped(con) or not ids:
        return pd.DataFrame(columns=COLUMNS)
    return con.execute(_HELD, [ids]).df()


def pending_submissions(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Live submissions with runs not re-computed yet: listed, never scored."""
    if not scoped(con):
        return pd.DataFrame(columns=["submitter", "bundle", "accepted_at", "pending", "runs"])
    return con.execute(
        f"""SELECT any_value(s.submitter) AS submitter, r.bundle_sha256[:12] AS bundle,
                   to_timestamp(any_value(s.accepted_at)) AS accepted_at,
                   count(*) FILTER (WHERE r.state = '{PENDING}') AS pending, count(*) AS runs
            FROM submission_runs r JOIN submissions s USING (bundle_sha256)
            WHERE s.withdrawn_at IS NULL GROUP BY r.bundle_sha256
            HAVING count(*) FILTER (WHERE r.state = '{PENDING}') > 0 ORDER BY accepted_at, bundle"""
    ).df()


def failed_runs(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """The live submissions' runs that could not be re-computed here: never counted, named here so that
    the page can say so."""
    if not scoped(con):
        return pd.DataFrame(columns=["cell", "submitter", "bundle", "failed_at", "reason"])
    return con.execute(
        f"""SELECT r.label AS cell, s.submitter, r.bundle_sha256[:12] AS bundle,
                   to_timestamp(r.recomputed_at) AS failed_at, r.reason
            FROM submission_runs r JOIN submissions s USING (bundle_sha256)
            WHERE s.withdrawn_at IS NULL AND r.state = '{FAILED}'
            ORDER BY r.label, bundle"""
    ).df()


@dataclass(frozen=True)
class Notices:
    """What the page says above every table about the board: submissions waiting for re-computation, and
    runs that could not be re-computed and never count."""

    pending: pd.DataFrame
    failed: pd.DataFrame


def notices(con: duckdb.DuckDBPyConnection) -> Notices:
    return Notices(pending_submissions(con), failed_runs(con))


def arm_badge(run_ids: Iterable[str], held: pd.DataFrame) -> tuple[str, str]:
    """(submission, badge) for an arm: its submitters, and ``re-computed`` (every run's numbers are the
    operator's), marked where a run's re-computed outputs differ from those its bundle claimed; an arm no
    live submission holds is ``local``."""
    rows = held.drop_duplicates("run_id").set_index("run_id").reindex(list(dict.fromkeys(run_ids)))
    if rows["submitter"].isna().all():
        return LOCAL, MISSING
    names = sorted({s or "anonymous" for s in rows["submitter"].dropna()})
    # a row can mix submitted runs with local ones (say, a full cache run here): both are named
    submitters = ", ".join(names + ([LOCAL] if rows["submitter"].isna().any() else []))
    if (rows["claim"] == DIFFERS).any():
        return submitters, CLAIM_DIFFERED
    assert rows["claim"].dropna().eq(MATCHES).all()
    return submitters, RECOMPUTED

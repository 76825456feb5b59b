"""Submission badges, on a copy of the board database with the tables `kvbench accept` and `kvbench
verify` write, filled here by hand: who submitted each row and whether a re-run confirmed it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from boardtest import by_policy, frame, open_app

from kvbench.submissions.board import SUBMISSION_TABLES

MACHINE = {"platform": "Linux-secret-kernel", "cpu": "Test CPU 9000", "gpu": "NVIDIA H200", "gpu_count": 2}


@pytest.fixture
def submitted_db(board_db: Path, tmp_path: Path) -> Path:
    """At 2x, the policies and the null held by Alice's submission (so paired within it): snapkv verified
    with identical outputs (an older failed check superseded); streaming verified, one of its runs on
    another machine (paired scores); random never checked. Carol's withdrawn submission holds nothing on
    the board any more; the full cache is held by nobody."""
    database = tmp_path / "submitted.duckdb"
    shutil.copyfile(board_db, database)
    con = duckdb.connect(str(database))
    con.execute(SUBMISSION_TABLES)  # as `kvbench accept` creates them
    runs = dict(
        con.execute(
            "SELECT policy || ':' || task, run_id FROM runs WHERE ratio = 2 AND role <> 'reference'"
        ).fetchall()
    )
    assert {key.split(":")[0] for key in runs} == {"snapkv", "streaming", "random"}
    for sha, who, withdrawn in (("alice", "Alice", None), ("carol", "Carol", 5.0)):
        con.execute(
            "INSERT INTO submissions VALUES (?, ?, '', 1, 2, 'maintainer-login', '0.1.0', ?, NULL)",
            [sha, who, withdrawn],
        )
    for key, run_id in runs.items():  # a hand-made board: each run keeps its own id as its board id
        con.execute(
            "INSERT INTO submission_runs VALUES ('alice', ?, ?, ?, 'digest', '{}')", [run_id, run_id, key]
        )
    checks = [
        ("alice", "snapkv:passkey", "failed", "identical outputs", 1.0),
        ("alice", "snapkv:passkey", "verified", "identical outputs", 2.0),
        ("alice", "snapkv:fidelity", "verified", "identical outputs", 2.0),
        ("alice", "streaming:passkey", "verified", "identical outputs", 2.0),
        ("alice", "streaming:fidelity", "verified", "paired scores", 3.0),
        ("carol", "random:passkey", "verified", "identical outputs", 2.0),
    ]
    for sha, run, outcome, method, when in checks:
        con.execute(
            "INSERT INTO verifications VALUES (?, ?, ?, ?, 2, ?, ?, '/home/m/x failed')",
            [sha, runs[run], outcome, method, json.dumps(MACHINE), when],
        )
    con.close()
    return database


def test_each_row_names_its_submission_and_verification(submitted_db: Path, monkeypatch) -> None:
    rows = by_policy(open_app(submitted_db, monkeypatch))
    badges = {policy: (row["submission"], row["verified"]) for policy, row in rows.items()}
    assert badges == {
        "snapkv": ("Alice", "verified (identical outputs)"),
        "streaming": ("Alice", "verified (paired scores)"),
        "random": ("Alice", "not verified"),  # Carol's verification is of her withdrawn submission
        "full": ("local", "—"),
    }


def test_provenance_shows_the_verifying_machine_by_model_names(submitted_db: Path, monkeypatch) -> None:
    app = open_app(submitted_db, monkeypatch, public=True)
    runs = frame(app, "Provenance").set_index("label")
    snap = runs[runs.index.str.contains("/snapkv@")]
    assert set(snap["submission"]) == {"Alice"} and set(snap["verification"]) == {"verified"}
    assert set(snap["verified_on"]) == {"Test CPU 9000 · 2× NVIDIA H200"}
    assert set(runs[runs.index.str.contains("/full@")]["submission"]) == {"local"}
    text = runs.astype(str).to_csv()
    assert "secret" not in text and "maintainer-login" not in text and "/home/m" not in text


def test_a_database_without_submission_tables_is_all_local(board_db: Path, monkeypatch) -> None:
    rows = by_policy(open_app(board_db, monkeypatch))
    assert {(r["submission"], r["verified"]) for r in rows.values()} == {("local", "—")}

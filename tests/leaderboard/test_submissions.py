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
    """At 2x: snapkv from Alice, verified (an older failed check superseded); streaming from Bob, one
    run's newest check failed; random from Dana, never checked, and from Carol, withdrawn but verified;
    the full cache held by nobody."""
    database = tmp_path / "submitted.duckdb"
    shutil.copyfile(board_db, database)
    con = duckdb.connect(str(database))
    con.execute(SUBMISSION_TABLES)  # as `kvbench accept` creates them
    runs = dict(
        con.execute(
            "SELECT policy || ':' || task, run_id FROM runs WHERE ratio = 2 AND role <> 'reference'"
        ).fetchall()
    )
    bundles = {
        "alice": ("Alice", None),
        "bob": ("Bob", None),
        "carol": ("Carol", 5.0),
        "dana": ("Dana", None),
    }
    for sha, (who, withdrawn) in bundles.items():
        con.execute(
            "INSERT INTO submissions VALUES (?, ?, '', 1, 2, 'maintainer-login', '0.1.0', ?, NULL)",
            [sha, who, withdrawn],
        )
    held = {"alice": "snapkv", "bob": "streaming", "carol": "random", "dana": "random"}
    for sha, policy in held.items():
        for task in ("passkey", "fidelity"):
            con.execute("INSERT INTO submission_runs VALUES (?, ?, true)", [sha, runs[f"{policy}:{task}"]])
    checks = [
        ("alice", "snapkv:passkey", "failed", 1.0),
        ("alice", "snapkv:passkey", "verified", 2.0),
        ("alice", "snapkv:fidelity", "verified", 2.0),
        ("bob", "streaming:passkey", "verified", 2.0),
        ("bob", "streaming:fidelity", "verified", 1.0),
        ("bob", "streaming:fidelity", "failed", 3.0),
        ("carol", "random:passkey", "verified", 2.0),
        ("carol", "random:fidelity", "verified", 2.0),
    ]
    for sha, run, outcome, when in checks:
        con.execute(
            "INSERT INTO verifications VALUES (?, ?, ?, 'identical outputs', 2, ?, ?, '/home/m/x failed')",
            [sha, runs[run], outcome, json.dumps(MACHINE), when],
        )
    con.close()
    return database


def test_each_row_names_its_submission_and_verification(submitted_db: Path, monkeypatch) -> None:
    rows = by_policy(open_app(submitted_db, monkeypatch))
    badges = {policy: (row["submission"], row["verified"]) for policy, row in rows.items()}
    assert badges == {
        "snapkv": ("Alice", "verified"),
        "streaming": ("Bob", "failed"),
        "random": ("Dana", "not verified"),  # Carol's verified bundle was withdrawn
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

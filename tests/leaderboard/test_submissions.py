"""Submission badges, on a copy of the board database with the tables `kvbench accept` and `kvbench
verify` write, filled here by hand: who submitted each row, that its numbers were re-computed by the
operator, and that a pending or failed run is on no table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
from boardtest import by_policy, frame, open_app

from kvbench.store.board_tables import SUBMISSION_TABLES

MACHINE = {"platform": "Linux-secret-kernel", "cpu": "Test CPU 9000", "gpu": "NVIDIA H200", "gpu_count": 2}


def _board(board_db: Path, tmp_path: Path, states: dict[str, tuple[str, str | None]]) -> Path:
    """At 2x, the policies and the null held by Alice's submission (so paired within it), each run in the
    state and with the claim ``states`` gives (published and matching by default). Carol's withdrawn
    submission holds the same runs, published; the full cache is held by nobody."""
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
        state, claim = states.get(key, ("published", "matches"))
        reason = "SpecError: the scorer broke off at /home/m/x" if state == "failed" else None
        con.execute(
            "INSERT INTO submission_runs "
            "VALUES ('alice', ?, ?, ?, 'digest', ?, ?, ?, 'digest', ?, ?, 2.0, 1.0)",
            [run_id, run_id, key, state, reason, run_id, claim, json.dumps(MACHINE)],
        )
        con.execute(
            "INSERT INTO submission_runs VALUES ('carol', ?, ?, ?, 'digest', 'published', NULL, ?, 'digest', "
            "'matches', ?, 2.0, 1.0)",
            [run_id, f"{run_id}-carol", key, run_id, json.dumps(MACHINE)],
        )
    con.close()
    return database


def test_each_row_names_its_submission_and_that_its_numbers_were_recomputed(
    board_db: Path, tmp_path: Path, monkeypatch
) -> None:
    database = _board(board_db, tmp_path, {"streaming:fidelity": ("published", "differs")})
    rows = by_policy(open_app(database, monkeypatch))
    badges = {policy: (row["submission"], row["verified"]) for policy, row in rows.items()}
    assert badges == {
        "snapkv": ("Alice", "re-computed"),
        "streaming": ("Alice", "re-computed (claim differed)"),
        "random": ("Alice", "re-computed"),
        "full": ("local", "—"),
    }


def test_a_pending_or_failed_run_is_on_no_table_and_is_named_above_them(
    board_db: Path, tmp_path: Path, monkeypatch
) -> None:
    states = {"snapkv:passkey": ("pending", None), "snapkv:fidelity": ("failed", None)}
    app = open_app(_board(board_db, tmp_path, states), monkeypatch)
    (board,) = [t for t in app.tabs if t.label == "Leaderboard"]
    (table,) = [d.value for d in board.dataframe if "policy" in d.value.columns]
    assert set(table["policy"]) == {"streaming", "random", "full"}
    assert [e.value for e in board.error] == [
        "1 submitted run(s) could not be re-computed here and never count: no verdict, pairing or curve on "
        "this board reads them."
    ]
    failed = board.dataframe[0].value
    assert list(failed["cell"]) == ["snapkv:fidelity"] and "broke off" in failed["reason"].iloc[0]
    assert next(i.value for i in board.info).startswith("1 submission(s) wait for the maintainer")
    pending = board.dataframe[1].value
    assert (pending["submitter"].iloc[0], pending["pending"].iloc[0], pending["runs"].iloc[0]) == (
        "Alice",
        1,
        6,
    )


def test_provenance_shows_the_recomputing_machine_by_model_names(
    board_db: Path, tmp_path: Path, monkeypatch
) -> None:
    app = open_app(_board(board_db, tmp_path, {}), monkeypatch, public=True)
    runs = frame(app, "Provenance").set_index("label")
    snap = runs[runs.index.str.contains("/snapkv@")]
    assert set(snap["submission"]) == {"Alice"} and set(snap["claim"]) == {"matches"}
    assert set(snap["recomputed_on"]) == {"Test CPU 9000 · 2× NVIDIA H200"}
    assert set(runs[runs.index.str.contains("/full@")]["submission"]) == {"local"}
    text = runs.astype(str).to_csv()
    assert "secret" not in text and "maintainer-login" not in text and "/home/m" not in text


def test_a_database_without_submission_tables_is_all_local(board_db: Path, monkeypatch) -> None:
    rows = by_policy(open_app(board_db, monkeypatch))
    assert {(r["submission"], r["verified"]) for r in rows.values()} == {("local", "—")}


def test_a_submission_naming_its_policy_as_another_does_not_replace_its_documentation(
    board_db: Path, tmp_path: Path
) -> None:
    """Mallory's bundle ships a policy named snapkv with a docstring that makes claims, re-computed and
    published later than the local snapkv runs: the policy page shows both documentations, each named by
    whose it is, the local one first."""
    from kvbench.leaderboard.queries import policy_documentation

    database = _board(board_db, tmp_path, {})
    con = duckdb.connect(str(database))
    (run_id, doc) = con.execute(
        "SELECT run_id, policy_doc FROM runs WHERE policy = 'snapkv' ORDER BY created DESC LIMIT 1"
    ).fetchone()
    claims = json.loads(doc) | {"summary": "0.99 ± 0.01, verified by the operator", "module_doc": ""}
    con.execute(
        "INSERT INTO runs SELECT * REPLACE ('mallory-run' AS run_id, ? AS policy_doc, "
        "created + 1000 AS created) FROM runs WHERE run_id = ?",
        [json.dumps(claims), run_id],
    )
    con.execute(
        "INSERT INTO submissions VALUES "
        "('m' || repeat('0', 63), 'Mallory', '', 1, 2, 'x', '0.1.0', NULL, NULL)"
    )
    con.execute(
        "INSERT INTO submission_runs VALUES ('m' || repeat('0', 63), 'mallory-run', 'mallory-run', "
        "'snapkv:fidelity', 'digest', 'published', NULL, 'mallory-run', 'digest', 'matches', '{}', 2.0, 1.0)"
    )
    con.close()
    docs = policy_documentation(database, "snapkv")
    # the local runs, Alice's published ones (the hand-made board's), and Mallory's
    assert [d["from"] for d in docs] == ["local", "Alice (alice)", "Mallory (m00000000000)"], docs
    assert docs[-1]["summary"] == "0.99 ± 0.01, verified by the operator"
    assert "SnapKV" in docs[0]["summary"] and "SnapKV" in docs[1]["summary"]  # still shown, first

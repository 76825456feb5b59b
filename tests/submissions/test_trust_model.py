"""The board's trust model, with real bundles: every number on a board is the operator's. An accepted
bundle is pending and scored nowhere; `kvbench verify --db` re-computes each run whole and publishes
what it computed; a run that cannot be re-computed is failed for good (unless computed again whole); a
withdrawal or a failure of one submission never touches another's runs; a failed first write leaves
no half-made board."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest
from submitting import cli, run_of
from tampering import forged
from test_hostile_scorers import WEAK_NULL, submit

import kvbench.leaderboard
from kvbench.leaderboard import queries
from kvbench.leaderboard.app import DATABASE_ENV
from kvbench.store.board_tables import board_run_id
from kvbench.submissions.withdraw import take_off
from support import needs_sandbox

APP = str(Path(kvbench.leaderboard.__file__).with_name("app.py"))
HONEST = '''
"""Keep the keys with the largest norm: an honest scorer."""
from kvbench import Policy, policy


@policy("honest-norm")
class Attack(Policy):
    def score(self, view):
        return view.keys.float().norm(dim=-1)
'''


def compared(db: Path, cwd: Path) -> dict[str, dict]:
    """`kvbench compare --format json` on the board: policy -> its row."""
    done = cli("compare", "--db", str(db), "--task", "passkey", "--format", "json", cwd=cwd)
    return {row["policy"]: row for row in json.loads(done.stdout)}


def scores(
    database: Path,
    *,
    policy: str | None = None,
    role: str | None = None,
    submission: str = "",
    column: str = "metric",
) -> dict[str, float]:
    """Problem -> mean ``column`` of one passkey run in a database (the submitter's own, or a board's,
    where ``submission`` names the bundle)."""
    with duckdb.connect(str(database), read_only=True) as con:
        found = con.execute(
            f"SELECT s.problem_id, avg(s.{column}) FROM samples s JOIN runs r USING (run_id) "
            "WHERE r.task = 'passkey' AND (? IS NULL OR r.policy = ?) AND (? IS NULL OR r.role = ?) "
            "AND ends_with(r.run_id, ?) GROUP BY ALL",
            [policy, policy, role, role, submission],
        ).fetchall()
    return dict(found)


def bundle_sha(bundle: Path) -> str:
    return hashlib.sha256(bundle.read_bytes()).hexdigest()


def difference(policy: dict[str, float], null: dict[str, float]) -> float:
    return sum(policy[p] - null[p] for p in policy) / len(policy)


@pytest.mark.slow
@needs_sandbox
def test_a_poisoned_null_never_reaches_the_board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hostile_root, honest_root = tmp_path / "hostile", tmp_path / "honest"
    hostile_root.mkdir(), honest_root.mkdir()
    hostile = submit(hostile_root, "weak_null", WEAK_NULL)
    honest = submit(honest_root, "honest_norm", HONEST)
    assert run_of(hostile, "passkey", "random") == run_of(honest, "passkey", "random")  # one null identity
    db, snapshot = tmp_path / "board.duckdb", tmp_path / "board.snapshot.duckdb"
    for bundle in (hostile, honest):
        cli("accept", str(bundle), "--db", str(db), cwd=tmp_path)
    assert compared(snapshot, tmp_path) == {}  # accepted is not scored
    assert len(queries.trust_notices(snapshot).pending) == 2
    for bundle in (hostile, honest):
        cli("verify", str(bundle), "--db", str(db), "--quiet", cwd=tmp_path)
    rows = compared(snapshot, tmp_path)
    own = hostile_root / "runs" / "kvbench.duckdb"
    honest_null = scores(honest_root / "runs" / "kvbench.duckdb", role="null")
    # the hostile submission's row pairs its policy with the null the operator computed, not its own
    assert rows["weak-null"]["delta"] == pytest.approx(
        difference(scores(own, policy="weak-null"), honest_null), abs=1e-12
    )
    # on the board, both submissions' nulls are the operator's (the needle kept as the honest null keeps
    # it); the hostile one's own null, the one it claimed, kept less of it
    board_nulls = [
        scores(snapshot, role="null", submission=bundle_sha(bundle), column="needle_survival")
        for bundle in (hostile, honest)
    ]
    honest_kept = scores(honest_root / "runs" / "kvbench.duckdb", role="null", column="needle_survival")
    assert board_nulls == [honest_kept, honest_kept]
    assert scores(own, role="null", column="needle_survival") != honest_kept
    honest_own = scores(honest_root / "runs" / "kvbench.duckdb", policy="honest-norm")
    assert rows["honest-norm"]["delta"] == pytest.approx(difference(honest_own, honest_null), abs=1e-12)
    notices = queries.trust_notices(snapshot)
    assert notices.pending.empty and notices.failed.empty
    monkeypatch.setenv(DATABASE_ENV, str(snapshot))
    app = AppTest.from_file(APP, default_timeout=120)
    app.run()
    assert not app.exception, app.exception
    (board,) = [t for t in app.tabs if t.label == "Leaderboard"]
    shown = board.dataframe[0].value.set_index("policy")
    assert shown.loc["weak-null", "verified"] == "re-computed"
    nulls = shown.loc["random", "verified"].tolist()
    assert sorted(nulls) == ["re-computed", "re-computed (claim differed)"]  # the hostile's claim is flagged


def test_a_withdrawal_refuses_no_other_submission(submission: Path, tmp_path: Path) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"

    def resubmitted(folder: Path) -> None:  # the same runs, sent by another group: the same null's outputs
        manifest = json.loads((folder / "bundle.json").read_text())
        (folder / "bundle.json").write_text(json.dumps(manifest | {"submitter": "another <a@example.org>"}))

    other = forged(bundle, tmp_path / "other.tar.gz", resubmitted)
    db = tmp_path / "board.duckdb"
    first = cli("accept", str(bundle), "--db", str(db), cwd=tmp_path)
    digest = first.stdout.split()[1].rstrip(":")
    cli("withdraw", digest, "--db", str(db), "--reason", "wrong revision", cwd=tmp_path)
    done = cli("accept", str(other), "--db", str(db), cwd=tmp_path)
    assert "pending" in done.stdout, done.stdout
    with duckdb.connect(str(tmp_path / "board.snapshot.duckdb"), read_only=True) as con:
        states = con.execute(
            "SELECT s.submitter, count(*) FROM submission_runs r JOIN submissions s USING (bundle_sha256) "
            "WHERE s.withdrawn_at IS NULL AND r.state = 'pending' GROUP BY ALL"
        ).fetchall()
    assert states == [("another <a@example.org>", 9)]


@pytest.mark.slow
@needs_sandbox
def test_a_failure_is_final_until_the_run_is_computed_again_whole(submission: Path, tmp_path: Path) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    db, snapshot = tmp_path / "board.duckdb", tmp_path / "board.snapshot.duckdb"
    cli("accept", str(bundle), "--db", str(db), cwd=tmp_path)
    policy = run_of(bundle, "passkey", "keys-norm")
    # a limit the scorer cannot meet here: loading its file takes longer than 10 ms
    failing = ("verify", str(bundle), "--db", str(db), "--scorer-seconds", "0.01", "--quiet")
    done = cli(*failing, cwd=tmp_path, check=False)  # the gpqa runs wait for --data: they stay pending
    assert done.returncode == 1, done.stdout + done.stderr
    failed = queries.trust_notices(snapshot).failed
    assert sorted(failed["cell"]) == sorted(
        f"tiny-qwen3/{t}/keys-norm@K=256" for t in ("fidelity", "passkey")
    )
    assert "keys-norm" not in compared(snapshot, tmp_path)
    # a later verification with the limit met does not make the failed runs count: only --retry does
    again = cli("verify", str(bundle), "--db", str(db), "--quiet", cwd=tmp_path, check=False)
    assert "keys-norm" not in compared(snapshot, tmp_path), again.stdout
    assert len(queries.trust_notices(snapshot).failed) == 2
    started = time.time()
    cli("verify", str(bundle), "--db", str(db), "--retry", "--quiet", cwd=tmp_path, check=False)
    assert compared(snapshot, tmp_path)["keys-norm"]["delta"] is not None
    assert queries.trust_notices(snapshot).failed.empty
    shards = list((tmp_path / "submissions").glob(f"*.recomputed/shards/{policy}/*.parquet"))
    assert len(shards) == 3 and all(s.stat().st_mtime >= started for s in shards)  # computed again whole


def test_a_failed_first_write_leaves_no_board(submission: Path, tmp_path: Path) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    db = tmp_path / "board.duckdb"
    (tmp_path / "submissions").write_text("a file where the board keeps its bundles")
    done = cli("accept", str(bundle), "--db", str(db), cwd=tmp_path, check=False)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in said, said
    assert "nothing was written" in said and str(tmp_path / "submissions") in said, said
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ingest.lock", "submissions"]
    (tmp_path / "submissions").unlink()
    cli("accept", str(bundle), "--db", str(db), cwd=tmp_path)
    assert len(queries.trust_notices(tmp_path / "board.snapshot.duckdb").pending) == 1


def test_two_bundles_whose_digests_share_a_long_prefix_never_share_a_board_run() -> None:
    """A submitter can search for two bundles whose sha256 agree in a prefix (12 hex digits took 3.5
    minutes on one core): board runs carry the whole digest, so the two never share a row."""
    first, second = "276de862ba54" + "f" * 52, "276de862ba54" + "0" * 52
    assert board_run_id("0123456789abcdef", first) != board_run_id("0123456789abcdef", second)
    assert board_run_id("0123456789abcdef", first).endswith(first)


def test_a_withdrawal_never_removes_a_run_another_live_submission_holds() -> None:
    """Were two live submissions to hold one board run (a board written by an earlier kvbench, whose run
    ids kept 12 digits of the bundle's), withdrawing one leaves the run on the board for the other."""
    con = duckdb.connect()
    con.execute("CREATE TABLE submissions (bundle_sha256 TEXT, withdrawn_at DOUBLE, withdrawn_reason TEXT)")
    con.execute("CREATE TABLE submission_runs (bundle_sha256 TEXT, run_id TEXT)")
    con.execute("CREATE TABLE runs (run_id TEXT)")
    con.execute("CREATE TABLE samples (run_id TEXT)")
    con.execute("INSERT INTO submissions VALUES ('a', NULL, NULL), ('b', NULL, NULL)")
    con.execute("INSERT INTO submission_runs VALUES ('a', 'shared'), ('b', 'shared'), ('a', 'own')")
    con.execute("INSERT INTO runs VALUES ('shared'), ('own')")
    con.execute("INSERT INTO samples VALUES ('shared'), ('own')")
    assert take_off(con, "a", 1.0, "test") == ["own"]
    assert con.execute("SELECT run_id FROM runs").fetchall() == [("shared",)]
    assert con.execute("SELECT run_id FROM samples").fetchall() == [("shared",)]
    # once the other is withdrawn too, nothing holds it
    assert take_off(con, "b", 2.0, "test") == ["shared"]

"""The board's trust model, with real bundles: a submission's policies are paired with its own null and
full cache; runs of one identity from two submissions coexist (on other machines silently, on the same
machine flagged as a conflict); a run that fails verification stops counting at once; `verify` says by
its exit status whether everything was verified."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest
from submitting import cells, cli, run_of
from tampering import edit_manifest, edit_samples, forged
from test_hostile_scorers import WEAK_NULL, submit

import kvbench.leaderboard
from kvbench.leaderboard import queries
from kvbench.leaderboard.app import DATABASE_ENV
from kvbench.store.board_tables import board_run_id
from kvbench.submissions.board import record_verification
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


def own_difference(root: Path, policy: str) -> float:
    """The mean over problems of (policy − null) in the submitter's own results: what pairing a policy
    with its own null gives, computed from the submitter's database alone."""
    with duckdb.connect(str(root / "runs" / "kvbench.duckdb"), read_only=True) as con:
        found = con.execute(
            """WITH scores AS (SELECT r.policy, r.role, s.problem_id, avg(s.metric) AS score
                               FROM samples s JOIN runs r USING (run_id) WHERE r.task = 'passkey'
                               GROUP BY ALL)
               SELECT avg(p.score - n.score) FROM scores p JOIN scores n USING (problem_id)
               WHERE p.policy = ? AND n.role = 'null'""",
            [policy],
        ).fetchone()
    assert found is not None and found[0] is not None
    return found[0]


@pytest.mark.slow
@needs_sandbox
def test_a_poisoned_null_blocks_no_honest_bundle_and_stops_counting_when_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile_root, honest_root = tmp_path / "hostile", tmp_path / "honest"
    hostile_root.mkdir(), honest_root.mkdir()
    hostile = submit(hostile_root, "weak_null", WEAK_NULL)
    honest = submit(honest_root, "honest_norm", HONEST)
    null = run_of(hostile, "passkey", "random")
    assert null == run_of(honest, "passkey", "random")  # one null identity, two different outputs
    db, snapshot = tmp_path / "board.duckdb", tmp_path / "board.snapshot.duckdb"
    cli("accept", str(hostile), "--db", str(db), cwd=tmp_path)
    accepted = cli("accept", str(honest), "--db", str(db), cwd=tmp_path)
    # the same spec on the same machine with other outputs: flagged, not first-come-wins
    assert "1 run(s) conflict with another submission's" in accepted.stdout, accepted.stdout
    assert f"run {null} " in accepted.stdout
    notices = queries.trust_notices(snapshot)
    assert len(notices.conflicts) == 1 and notices.failed.empty
    rows = compared(snapshot, tmp_path)
    # each policy is paired with its own submission's null: the differences its submitter's data give
    for root, policy in ((honest_root, "honest-norm"), (hostile_root, "weak-null")):
        assert rows[policy]["delta"] == pytest.approx(own_difference(root, policy), abs=1e-12)
    honest_verdict = rows["honest-norm"]["verdict"]

    done = cli("verify", str(hostile), "--sample", "2", "--db", str(db), "--quiet", cwd=tmp_path, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 run(s) failed verification and no longer count" in done.stdout, done.stdout
    after = compared(snapshot, tmp_path)
    assert after["weak-null"]["verdict"] == "no matching baseline"  # its null's pairings are gone
    assert after["weak-null"]["delta"] is None
    assert after["honest-norm"]["delta"] == rows["honest-norm"]["delta"]
    assert after["honest-norm"]["verdict"] == honest_verdict
    notices = queries.trust_notices(snapshot)
    assert notices.conflicts.empty  # verification decided it
    assert len(notices.failed) == 1 and "/random@" in notices.failed["cell"].iloc[0]
    monkeypatch.setenv(DATABASE_ENV, str(snapshot))
    app = AppTest.from_file(APP, default_timeout=120)
    app.run()
    assert not app.exception, app.exception
    (board,) = [t for t in app.tabs if t.label == "Leaderboard"]
    assert [e.value for e in board.error] == [
        "1 submitted run(s) failed verification and no longer count: no verdict, pairing or curve on this "
        "board reads them."
    ]
    shown = board.dataframe[0].value
    assert "/random@" in shown["cell"].iloc[0] and shown["submitter"].iloc[0] == "hostile <h@example.org>"
    with duckdb.connect(str(snapshot), read_only=True) as con:
        (held,) = con.execute("SELECT count(*) FROM runs WHERE starts_with(run_id, ?)", [null]).fetchone()
    assert held == 1  # the honest null only


def _moved(folder: Path, run_ids: list[str], features: str) -> None:
    for run_id in run_ids:
        edit_manifest(folder, run_id, lambda run: run["hardware"].update(cpu_vector_features=features))


def _other_outputs(folder: Path, run_id: str) -> None:
    edit_samples(folder, run_id, lambda row: row.update(metric=max(0.0, row["metric"] - 0.01)))


def test_runs_of_one_identity_from_other_machines_coexist_and_on_one_machine_conflict(
    submission: Path, tmp_path: Path
) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    ids = [c["run_id"] for c in cells(bundle)]
    fidelity = run_of(bundle, "fidelity", "keys-norm")

    def elsewhere(folder: Path) -> None:  # an honest group on another CPU: other bits, other features
        _moved(folder, ids, "avx2 fma")
        _other_outputs(folder, fidelity)

    other_machine = forged(bundle, tmp_path / "other.tar.gz", elsewhere, output_digests=True)
    same_machine = forged(
        bundle, tmp_path / "same.tar.gz", lambda f: _other_outputs(f, fidelity), output_digests=True
    )
    db = tmp_path / "board.duckdb"
    cli("accept", str(bundle), "--db", str(db), cwd=tmp_path)
    second = cli("accept", str(other_machine), "--db", str(db), cwd=tmp_path)
    assert "conflict" not in second.stdout, second.stdout  # other machines: both simply count
    snapshot = tmp_path / "board.snapshot.duckdb"
    assert queries.trust_notices(snapshot).conflicts.empty
    done = cli("compare", "--db", str(snapshot), "--task", "fidelity", "--format", "json", cwd=tmp_path)
    rows = [r for r in json.loads(done.stdout) if r["policy"] == "keys-norm"]
    assert len(rows) == 2 and len({r["submission"] for r in rows}) == 2  # one per submission
    assert rows[0]["delta"] != rows[1]["delta"]  # each paired with its own null
    third = cli("accept", str(same_machine), "--db", str(db), cwd=tmp_path)
    assert "1 run(s) conflict" in third.stdout and f"run {fidelity} " in third.stdout, third.stdout
    (found,) = queries.trust_notices(snapshot).conflicts.itertuples()
    assert "/keys-norm@" in found.cell
    table = queries.leaderboard(snapshot, "tiny-qwen3", "protect-prompt", queries.Compression(4.0, None))
    badges = table.frame.loc[table.frame["policy"] == "keys-norm", "verified"]
    assert sorted(badges) == ["conflict", "conflict", "not verified"]
    # verification decides: the failed side leaves the board at once, a later pass brings it back
    sha = hashlib.sha256(same_machine.read_bytes()).hexdigest()
    board_id = board_run_id(fidelity, sha)

    def check(outcome: str) -> list[str]:
        found = {"run_id": fidelity, "outcome": outcome, "method": "identical outputs", "problems": 2}
        return record_verification(db, sha, [found | {"machine": {}, "detail": "", "seed": 1}])

    assert check("failed") == [board_id]
    with duckdb.connect(str(snapshot), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM samples WHERE run_id = ?", [board_id]).fetchone() == (0,)
    notices = queries.trust_notices(snapshot)
    assert notices.conflicts.empty and list(notices.failed["bundle"]) == [sha[:12]]
    assert check("verified") == []
    with duckdb.connect(str(snapshot), read_only=True) as con:
        restored = con.execute("SELECT count(*) FROM samples WHERE run_id = ?", [board_id]).fetchone()
    assert restored == (3,)  # its three problems, from the kept bundle
    assert len(queries.trust_notices(snapshot).conflicts) == 1


@pytest.mark.slow
@needs_sandbox
def test_verification_is_exact_only_on_the_machine_the_runs_recorded(
    submission: Path, tmp_path: Path
) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    passkey = [run_of(bundle, "passkey", p) for p in ("keys-norm", "random", "full")]
    moved = forged(bundle, tmp_path / "moved.tar.gz", lambda f: _moved(f, passkey, "avx2 fma"))
    done = cli(
        "verify", str(moved), "--sample", "1", "--json", "verify.json", "--quiet", cwd=tmp_path, check=False
    )
    outcomes = {o["run_id"]: o for o in json.loads((tmp_path / "verify.json").read_text())["outcomes"]}
    for run_id in passkey:  # recorded elsewhere: the scores must agree, not the bits
        assert (outcomes[run_id]["outcome"], outcomes[run_id]["method"]) == ("verified", "paired scores")
        assert "recorded on another machine (cpu_vector_features avx2 fma -> " in outcomes[run_id]["detail"]
    fidelity = run_of(bundle, "fidelity", "keys-norm")
    assert outcomes[fidelity]["method"] == "identical outputs"  # recorded here: exact
    # the gpqa runs need their data (--data), not given: they cannot be verified, and the status says so
    unverified = {r for r, o in outcomes.items() if o["outcome"] == "not verified"}
    assert len(unverified) == 3
    assert done.returncode == 3, done.stdout + done.stderr
    assert "3 run(s) not verified: " in done.stdout and all(r in done.stdout for r in unverified)

"""`kvbench verify`: every run of a bundle re-computed whole on the operator's machine. The genuine CPU
bundle's claims match; a bundle doctored outside anything a sampled re-run would draw (one problem's
scores, the eviction cost, the machine it claims) passes `accept`, and the board shows the numbers the
operator computed, never the doctored ones."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest
from submitting import HUB, KVBENCH, cells, cli, run_of
from tampering import edit_manifest, edit_samples, forged

import kvbench.leaderboard
from kvbench.leaderboard import downloads, queries
from kvbench.leaderboard.app import DATABASE_ENV
from kvbench.leaderboard.public import PUBLIC_ENV

APP = str(Path(kvbench.leaderboard.__file__).with_name("app.py"))

GPQA_DATA = f"gpqa-diamond={HUB / 'Idavidrein/gpqa'}"


def _doctor(folder: Path, bundle: Path) -> None:
    """What a sampled re-run could miss: one problem of the fidelity policy's scored higher, every
    sample's eviction cost cut to a thousandth, and another machine claimed for every run."""
    fidelity = run_of(bundle, "fidelity", "keys-norm")
    changed: list[str] = []

    def better(row: dict) -> None:
        if not changed or row["problem_hash"] == changed[0]:
            changed[:1] = [row["problem_hash"]]
            row.update(metric=min(1.0, row["metric"] + 0.2))

    edit_samples(folder, fidelity, better)
    for cell in cells(bundle):
        edit_samples(
            folder, cell["run_id"], lambda row: row.update(eviction_seconds=row["eviction_seconds"] / 1000)
        )
        edit_manifest(folder, cell["run_id"], lambda run: run["hardware"].update(cpu="Claimed CPU 9000"))


@pytest.fixture(scope="module")
def board(submission: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A board holding the genuine bundle and a doctored copy of it (another submission), both accepted
    and re-computed as docs/submissions.md tells an operator to."""
    root = tmp_path_factory.mktemp("board")
    bundle = shutil.copy(submission / "bundle.kvbench.tar.gz", root / "genuine.tar.gz")
    doctored = forged(bundle, root / "doctored.tar.gz", lambda f: _doctor(f, bundle), output_digests=True)
    db = root / "board.duckdb"
    for path in (bundle, doctored):
        cli("accept", str(path), "--db", str(db), cwd=root)
    # accepted, nothing scored: the board lists both as pending
    assert (
        cli(
            "compare", "--db", str(root / "board.snapshot.duckdb"), "--format", "json", cwd=root
        ).stdout.strip()
        == "[]"
    )
    for path in (bundle, doctored):
        done = cli(
            "verify", str(path), "--data", GPQA_DATA, "--db", str(db), "--json", f"{path.stem}.json", cwd=root
        )
        assert "9 run(s) published" in done.stdout, done.stdout
        # the plan states the most time the shipped scorer may hold this machine: 2 runs, an hour each
        plan = " ".join(done.stdout.split())
        assert "(2 run(s) with a shipped scorer: at most 2.0 h of scorer time in all;" in plan, plan
    return root


def _outcomes(root: Path, name: str) -> dict[str, dict]:
    return {o["run_id"]: o for o in json.loads((root / f"{name}.json").read_text())["outcomes"]}


def test_the_genuine_bundle_recomputes_to_its_claims_and_the_board_shows_it(
    board: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    genuine = _outcomes(board, "genuine.tar")
    assert {(o["outcome"], o["claim"]) for o in genuine.values()} == {("re-computed", "matches")}
    assert {o["run_id"] for o in genuine.values()} == {c["run_id"] for c in cells(board / "genuine.tar.gz")}
    monkeypatch.setenv(DATABASE_ENV, str(board / "board.snapshot.duckdb"))
    monkeypatch.setenv(PUBLIC_ENV, "1")
    app = AppTest.from_file(APP, default_timeout=120)
    app.run()
    assert not app.exception, app.exception
    (page,) = [t for t in app.tabs if t.label == "Leaderboard"]
    rows = page.dataframe[0].value
    keys_norm = rows[rows["policy"] == "keys-norm"]
    assert sorted(keys_norm["verified"]) == ["re-computed", "re-computed (claim differed)"]


def test_a_doctored_bundle_shows_only_what_the_operator_computed(board: Path) -> None:
    doctored = _outcomes(board, "doctored.tar")
    fidelity = run_of(board / "genuine.tar.gz", "fidelity", "keys-norm")
    assert (doctored[fidelity]["outcome"], doctored[fidelity]["claim"]) == ("re-computed", "differs")
    snapshot = board / "board.snapshot.duckdb"
    done = cli("compare", "--db", str(snapshot), "--task", "fidelity", "--format", "json", cwd=board)
    rows = [r for r in json.loads(done.stdout) if r["policy"] == "keys-norm"]
    assert len(rows) == 2 and len({r["submission"] for r in rows}) == 2
    # the doctored problem is not on the board: both submissions read the operator's identical numbers
    assert rows[0]["delta"] == rows[1]["delta"] and rows[0]["score"] == rows[1]["score"]
    with duckdb.connect(str(snapshot), read_only=True) as con:
        ids = [r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()]
        cpus = {r[0] for r in con.execute("SELECT DISTINCT hardware->>'cpu' FROM runs").fetchall()}
    assert "Claimed CPU 9000" not in cpus  # the machine on the board is the operator's
    doctored_ids = [i for i in ids if i.endswith(_sha(board / "doctored.tar.gz"))]
    genuine_ids = [i for i in ids if i not in doctored_ids]
    assert len(doctored_ids) == len(genuine_ids) == 9
    # the eviction cost is the operator's measurement: the doctored claim was a thousandth of it
    ms = {
        name: queries.eviction_cost(snapshot, group).set_index("policy")["ms_per_event"]
        for name, group in (("doctored", doctored_ids), ("genuine", genuine_ids))
    }
    assert ((ms["doctored"] / ms["genuine"]).between(0.2, 5)).all(), ms
    shown = downloads.published_samples(snapshot, ids).frame
    mine = shown[shown["run_id"].isin(doctored_ids)].drop(columns=["run_id"]).reset_index(drop=True)
    theirs = shown[shown["run_id"].isin(genuine_ids)].drop(columns=["run_id"]).reset_index(drop=True)
    assert (
        mine.sort_values(["task", "problem_id", "sample"])
        .reset_index(drop=True)
        .equals(theirs.sort_values(["task", "problem_id", "sample"]).reset_index(drop=True))
    )


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_recomputation_killed_mid_way_resumes_losing_and_repeating_nothing(
    submission: Path, tmp_path: Path
) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    db = tmp_path / "board.duckdb"
    cli("accept", str(bundle), "--db", str(db), cwd=tmp_path)
    command = [KVBENCH, "verify", _sha(bundle)[:16], "--db", str(db), "--data", GPQA_DATA, "--quiet"]
    shards = tmp_path / "submissions" / f"{_sha(bundle)}.recomputed" / "shards"
    with subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as first:
        deadline = time.monotonic() + 300
        while len(list(shards.glob("*/*.parquet"))) < 5 and first.poll() is None:
            assert time.monotonic() < deadline, "no shard written in 300 s"
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert first.returncode == -signal.SIGKILL, "the re-computation finished before it could be killed"
    before = {p: p.stat().st_mtime_ns for p in shards.glob("*/*.parquet")}
    assert 5 <= len(before) < 24  # 24 problems in all: 3 runs × 3 passkey, 3 × 3 fidelity, 3 × 2 gpqa-diamond
    with duckdb.connect(str(tmp_path / "board.snapshot.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)  # nothing published mid-way
    done = cli(*command[1:], cwd=tmp_path)
    assert f"{24 - len(before)} problem(s) computed, {len(before)} reused" in done.stdout, done.stdout
    assert "9 run(s) published" in done.stdout
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())  # reused, not computed again
    with duckdb.connect(str(tmp_path / "board.snapshot.duckdb"), read_only=True) as con:
        count, keys = con.execute(
            "SELECT count(*), count(DISTINCT (run_id, problem_id, sample)) FROM samples"
        ).fetchone()
    assert count == keys == 42  # every sample of the bundle's 9 runs, once

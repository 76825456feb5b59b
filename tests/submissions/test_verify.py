"""`kvbench verify`: the genuine CPU bundle re-runs to identical outputs; a bundle whose outputs were
edited with every digest recomputed passes `accept` and fails `verify`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest
from submitting import HUB, cells, cli, run_of
from tampering import edit_samples, forged

import kvbench.leaderboard
from kvbench.leaderboard.app import DATABASE_ENV
from kvbench.leaderboard.public import PUBLIC_ENV

APP = str(Path(kvbench.leaderboard.__file__).with_name("app.py"))

GPQA_DATA = f"gpqa-diamond={HUB / 'Idavidrein/gpqa'}"


def test_the_genuine_bundle_verifies_with_identical_outputs_and_the_board_shows_it(
    submission: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    db = tmp_path / "board.duckdb"
    cli("accept", str(bundle), "--db", str(db), cwd=tmp_path)
    done = cli(
        "verify", str(bundle), "--sample", "2", "--data", GPQA_DATA, "--db", str(db), "--quiet", cwd=tmp_path
    )
    with duckdb.connect(str(tmp_path / "board.snapshot.duckdb"), read_only=True) as con:
        found = con.execute(
            "SELECT run_id, outcome, method, problems, machine->>'cpu' FROM verifications"
        ).fetchall()
    assert {r[0] for r in found} == {c["run_id"] for c in cells(bundle)}, done.stdout
    assert {(r[1], r[2], r[3]) for r in found} == {("verified", "identical outputs", 2)}, done.stdout
    assert all(r[4] for r in found)  # the machine that checked is named
    # the public board shows who submitted the rows and that a re-run confirmed them
    monkeypatch.setenv(DATABASE_ENV, str(tmp_path / "board.snapshot.duckdb"))
    monkeypatch.setenv(PUBLIC_ENV, "1")
    app = AppTest.from_file(APP, default_timeout=120)
    app.run()
    assert not app.exception, app.exception
    (board,) = [t for t in app.tabs if t.label == "Leaderboard"]
    rows = board.dataframe[0].value.set_index("policy")
    assert rows.loc["keys-norm", ["submission", "verified"]].tolist() == [
        "tests <t@example.org>",
        "verified (identical outputs)",
    ]


def test_on_another_attention_the_scores_are_held_to_the_intervals(submission: Path, tmp_path: Path) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    cli(
        "verify",
        str(bundle),
        "--sample",
        "2",
        "--attention",
        "eager",
        "--data",
        GPQA_DATA,
        "--json",
        str(tmp_path / "verify.json"),
        "--quiet",
        cwd=tmp_path,
    )
    outcomes = json.loads((tmp_path / "verify.json").read_text())["outcomes"]
    assert {(o["outcome"], o["method"], o["problems"]) for o in outcomes} == {
        ("verified", "paired scores", 2)
    }
    fidelity = next(o for o in outcomes if o["run_id"] == run_of(bundle, "fidelity", "keys-norm"))
    shift, half = map(float, re.findall(r"[-+]?\d+\.\d+", fidelity["detail"]))
    assert abs(shift) <= half and half > 0  # a continuous probe: a real interval, not a point


def test_outputs_edited_with_recomputed_digests_pass_accept_and_fail_verify(
    submission: Path, tmp_path: Path
) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    edited = run_of(bundle, "fidelity", "keys-norm")

    def better_outputs(folder: Path) -> None:
        edit_samples(folder, edited, lambda row: row.update(metric=min(1.0, row["metric"] + 0.05)))

    forgery = forged(bundle, tmp_path / "forged.tar.gz", better_outputs, output_digests=True)
    db = tmp_path / "board.duckdb"
    cli("accept", str(forgery), "--db", str(db), cwd=tmp_path)
    done = cli(
        "verify",
        str(forgery),
        "--sample",
        "3",
        "--data",
        GPQA_DATA,
        "--db",
        str(db),
        "--quiet",
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    with duckdb.connect(str(tmp_path / "board.snapshot.duckdb"), read_only=True) as con:
        outcomes = dict(con.execute("SELECT run_id, outcome FROM verifications").fetchall())
    assert outcomes.pop(edited) == "failed"
    assert set(outcomes.values()) == {"verified"}
    # on another runtime the scores are compared: the inflated ones are off by more than the interval
    again = cli(
        "verify",
        str(forgery),
        "--sample",
        "3",
        "--attention",
        "eager",
        "--data",
        GPQA_DATA,
        "--json",
        str(tmp_path / "eager.json"),
        "--quiet",
        cwd=tmp_path,
        check=False,
    )
    assert again.returncode == 1, again.stdout + again.stderr
    judged = {o["run_id"]: o for o in json.loads((tmp_path / "eager.json").read_text())["outcomes"]}
    assert (judged[edited]["outcome"], judged[edited]["method"]) == ("failed", "paired scores")
    assert {o["outcome"] for run_id, o in judged.items() if run_id != edited} == {"verified"}

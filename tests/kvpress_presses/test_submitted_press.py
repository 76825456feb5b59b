"""A kvpress press enters a board like any entrant: its runs are exported (no source shipped: kvpress is
an installed package, its version in the run's identity), accepted, re-computed by running the press in
this machine's kvpress venv, and compared against their own null."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from invoke import kvbench
from kvpress_support import kvpress_python


def cli(*args: str, cwd: Path, status: int = 0) -> str:
    done = kvbench(*args, cwd=cwd)
    assert done.returncode == status, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_a_kvpress_press_is_exported_accepted_and_verified(tmp_path: Path) -> None:
    kvpress_python()
    cli(
        *("run", "--model", "tiny-qwen3", "--task", "passkey", "--policy", "kvpress:KnormPress"),
        *("--limit", "2", "--quiet"),
        cwd=tmp_path,
    )
    bundle = tmp_path / "press.kvbench.tar.gz"
    cli("export", str(bundle), "--submitter", "press user", cwd=tmp_path)
    db = tmp_path / "board" / "kvbench.duckdb"
    assert "accepted" in cli("accept", str(bundle), "--db", str(db), cwd=tmp_path)
    cli("verify", str(bundle), "--db", str(db), "--json", "v.json", "--quiet", cwd=tmp_path)
    outcomes = json.loads((tmp_path / "v.json").read_text())["outcomes"]
    assert {(o["outcome"], o["claim"]) for o in outcomes} == {("re-computed", "matches")}
    assert any(o["label"].startswith("tiny-qwen3/passkey/kvpress-knorm@") for o in outcomes)
    rows = json.loads(cli("compare", "--db", str(db.with_name("kvbench.snapshot.duckdb")), "--format",
                          "json", cwd=tmp_path))  # fmt: skip
    (press,) = [r for r in rows if r["policy"] == "kvpress-knorm"]
    assert press["verdict"] != "no matching baseline" and press["submission"]

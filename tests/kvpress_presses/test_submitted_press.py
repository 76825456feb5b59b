"""A kvpress press enters a board like any entrant: its runs are exported (no source shipped: kvpress is
an installed package, its version in the run's identity), accepted, re-computed by running the press in
this machine's kvpress venv, and compared against their own null. A press recorded with a kvpress version
this machine lacks cannot be re-computed: failed, with the version named, and never on the board."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from invoke import kvbench
from kvpress_support import kvpress_python

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "submissions"))
from tampering import edit_manifest, forged, reidentified


def cli(*args: str, cwd: Path, status: int = 0) -> str:
    done = kvbench(*args, cwd=cwd)
    assert done.returncode == status, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def press_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An honest bundle of a KnormPress run (and its null and full cache) on the tiny model."""
    kvpress_python()
    where = tmp_path_factory.mktemp("press-run")
    cli(
        *("run", "--model", "tiny-qwen3", "--task", "passkey", "--policy", "kvpress:KnormPress"),
        *("--limit", "2", "--quiet"),
        cwd=where,
    )
    bundle = where / "press.kvbench.tar.gz"
    cli("export", str(bundle), "--submitter", "press user", cwd=where)
    return bundle


@pytest.mark.slow
def test_a_kvpress_press_is_exported_accepted_and_verified(press_bundle: Path, tmp_path: Path) -> None:
    bundle = press_bundle
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


@pytest.mark.slow
def test_a_press_recorded_with_a_kvpress_this_machine_lacks_fails_and_is_never_ranked(
    press_bundle: Path, tmp_path: Path
) -> None:
    """The press run's recorded kvpress version edited (and its identity made to match, as a forger
    would): accepted, then failed at verify with the version named; its null and full cache are
    re-computed, and the board ranks no press."""

    def older_kvpress(folder: Path) -> None:
        for manifest in (folder / "runs").glob("*/manifest.json"):
            run = json.loads(manifest.read_text())
            if run["spec"]["policy"]["name"] == "kvpress-knorm":
                run["spec"]["policy"]["params"]["kvpress_version"] = "0.0.1"
                edit_manifest(folder, manifest.parent.name, lambda r, run=run: r.update(spec=run["spec"]))
        reidentified(folder)

    bundle = forged(press_bundle, tmp_path / "old-press.kvbench.tar.gz", older_kvpress)
    db = tmp_path / "board" / "kvbench.duckdb"
    assert "accepted" in cli("accept", str(bundle), "--db", str(db), cwd=tmp_path)
    cli("verify", str(bundle), "--db", str(db), "--json", "v.json", "--quiet", cwd=tmp_path, status=1)
    outcomes = {
        o["label"].split("@")[0]: o for o in json.loads((tmp_path / "v.json").read_text())["outcomes"]
    }
    press = outcomes["tiny-qwen3/passkey/kvpress-knorm"]
    assert press["outcome"] == "failed"
    assert "0.0.1" in press["detail"]
    assert {o["outcome"] for label, o in outcomes.items() if "knorm" not in label} == {"re-computed"}
    rows = json.loads(cli("compare", "--db", str(db.with_name("kvbench.snapshot.duckdb")), "--format",
                          "json", cwd=tmp_path))  # fmt: skip
    assert [r["policy"] for r in rows if r["policy"] == "kvpress-knorm"] == []

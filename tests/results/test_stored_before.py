"""Results stored before the typed resolved spec and the one pairing rule read back as they did: the
store-v4 fixture (written by an older kvbench) rebuilt from its shards compares exactly as kvbench
compared it before the change (tests/fixtures/store-v4/compare.json and .csv were written by kvbench at
commit fd01a30, the last one before it), and every stored spec parses and hashes to its run id."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from kvbench.specs.resolved import ResolvedSpec, digest

V4 = Path(__file__).resolve().parents[1] / "fixtures" / "store-v4"
KVBENCH = str(Path(sys.executable).parent / "kvbench")


def kvbench(*args: str, cwd: Path) -> str:
    done = subprocess.run([KVBENCH, *args], capture_output=True, text=True, cwd=cwd, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_an_old_store_compares_exactly_as_before(tmp_path: Path) -> None:
    shutil.copytree(V4 / "shards", tmp_path / "runs" / "shards")
    kvbench("ingest", "--rebuild", "--out", "runs", cwd=tmp_path)
    assert kvbench("compare", "--format", "json", cwd=tmp_path) == (V4 / "compare.json").read_text()
    assert kvbench("compare", "--format", "csv", cwd=tmp_path) == (V4 / "compare.csv").read_text()


def test_every_stored_spec_keeps_its_identity() -> None:
    manifests = [json.loads(p.read_text()) for p in sorted((V4 / "shards").glob("*/manifest.json"))]
    assert len(manifests) == 9
    for manifest in manifests:
        spec = ResolvedSpec.read(manifest["spec"], manifest.get("role"))
        assert spec.record() == manifest["spec"]
        assert spec.identity == digest(manifest["spec"]) == manifest["run_id"]
        assert spec.role == (manifest.get("role") or "policy")

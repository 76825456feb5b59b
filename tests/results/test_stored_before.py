"""Results stored before the typed resolved spec and the one pairing rule read back as they did: the
store-v4 fixture (written by an older kvbench) rebuilt from its shards compares exactly as kvbench
compared it before the change (tests/fixtures/store-v4/compare.json and .csv were written by kvbench at
commit fd01a30, the last one before it), and every stored spec parses and hashes to its run id.

Columns added since (the equivalence margin, the minimum detectable effect, token costs) may join the
output; every column the old output had keeps its value, but for one change made on purpose: a verdict
the sign test could not reach, once "ties null", now says which of "equivalent to null" and
"inconclusive" it is."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path

import invoke

from kvbench.specs.resolved import ResolvedSpec, digest

V4 = Path(__file__).resolve().parents[1] / "fixtures" / "store-v4"


def kvbench(*args: str, cwd: Path) -> str:
    done = invoke.kvbench(*args, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


UNDECIDED = {"equivalent to null", "inconclusive"}
"""What an old "ties null" may have become: the sign test's own verdicts did not move."""


def _same(before: list[dict], after: list[dict]) -> None:
    assert len(after) == len(before)
    for old, new in zip(before, after, strict=True):
        for key, value in old.items():
            if key == "verdict" and value == "ties null":
                assert new[key] in UNDECIDED, (key, new[key])
            elif isinstance(value, float) and math.isnan(value):
                assert math.isnan(float(new[key])), (key, new[key])
            else:
                assert new[key] == value, (key, value, new[key])


def test_an_old_store_compares_as_before(tmp_path: Path) -> None:
    shutil.copytree(V4 / "shards", tmp_path / "runs" / "shards")
    kvbench("ingest", "--rebuild", "--out", "runs", cwd=tmp_path)
    before = json.loads((V4 / "compare.json").read_text())
    assert {row["verdict"] for row in before} == {"ties null"}
    _same(before, json.loads(kvbench("compare", "--format", "json", cwd=tmp_path)))

    def rows(text: str) -> list[dict]:
        return [
            {k: float(v) if _number(v) else v for k, v in r.items()}
            for r in csv.DictReader(io.StringIO(text))
        ]

    old_csv = rows((V4 / "compare.csv").read_text())
    _same(old_csv, rows(kvbench("compare", "--format", "csv", cwd=tmp_path)))


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_every_stored_spec_keeps_its_identity() -> None:
    manifests = [json.loads(p.read_text()) for p in sorted((V4 / "shards").glob("*/manifest.json"))]
    assert len(manifests) == 9
    for manifest in manifests:
        spec = ResolvedSpec.read(manifest["spec"], manifest.get("role"))
        assert spec.record() == manifest["spec"]
        assert spec.identity == digest(manifest["spec"]) == manifest["run_id"]
        assert spec.role == (manifest.get("role") or "policy")

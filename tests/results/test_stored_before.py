"""Results stored before the typed resolved spec and the one pairing rule read back as they did: the
store-v4 fixture (written by an older kvbench) rebuilt from its shards compares exactly as kvbench
compared it before the change (tests/fixtures/store-v4/compare.json and .csv were written by kvbench at
commit fd01a30, the last one before it), and every stored spec parses and hashes to its run id.

Columns added since (the equivalence margin, the minimum detectable effect, token costs) may join the
output; every column the old output had keeps its value, but for two changes made on purpose: a verdict
the sign test could not reach, once "ties null", now says which of "equivalent to null" and
"inconclusive" it is; and the interval of Δ, once a percentile bootstrap (which covered a mean 79% of
the time at 4 problems), is now the exact one for one pass/fail sample per problem and the studentized
bootstrap's otherwise, checked here against both written out apart from kvbench."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path

import duckdb
import invoke
import pytest
from bootstrap_by_hand import bootstrap_interval

from kvbench.specs.resolved import ResolvedSpec, digest

V4 = Path(__file__).resolve().parents[1] / "fixtures" / "store-v4"


def kvbench(*args: str, cwd: Path) -> str:
    done = invoke.kvbench(*args, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


UNDECIDED = {"equivalent to null", "inconclusive"}
"""What an old "ties null" may have become: the sign test's own verdicts did not move."""


INTERVAL = ("delta_low", "delta_high")


def _deltas(database: Path, task: str) -> list[float]:
    """snapkv − the null per problem of ``task``, in SQL, in the order of the problem ids."""
    with duckdb.connect(str(database), read_only=True) as con:
        rows = con.execute(
            "WITH p AS (SELECT role, problem_id, avg(metric) AS m FROM samples JOIN runs USING (run_id) "
            "WHERE runs.task = ? GROUP BY ALL) SELECT a.m - b.m FROM p a JOIN p b USING (problem_id) "
            "WHERE a.role = 'policy' AND b.role = 'null' ORDER BY problem_id",
            [task],
        ).fetchall()
    return [d for (d,) in rows]


def _interval(row: dict, database: Path) -> tuple[float, float]:
    """The interval of Δ the row must show now: its problems are two, each with one sample."""
    if row["task"] == "fidelity":  # top-1 agreement, a proportion: the studentized bootstrap
        return bootstrap_interval(_deltas(database, "fidelity"))
    # pass/fail with both problems tied: the exact interval's ends are where two ties in a row have
    # probability 2.5% at the least discordance a mean of ±Δ allows, (1 − Δ)² = 0.025
    end = 1 - 0.025**0.5
    return -end, end


def _same(before: list[dict], after: list[dict], database: Path) -> None:
    assert len(after) == len(before)
    for old, new in zip(before, after, strict=True):
        for key, value in old.items():
            if key in INTERVAL:  # the exact interval's ends are bisected to 1e-6
                expected = _interval(old, database)[INTERVAL.index(key)]
                assert float(new[key]) == pytest.approx(expected, abs=1e-6), (key, new[key])
            elif key == "verdict" and value == "ties null":
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
    database = tmp_path / "runs" / "kvbench.snapshot.duckdb"
    _same(before, json.loads(kvbench("compare", "--format", "json", cwd=tmp_path)), database)

    def rows(text: str) -> list[dict]:
        return [
            {k: float(v) if _number(v) else v for k, v in r.items()}
            for r in csv.DictReader(io.StringIO(text))
        ]

    old_csv = rows((V4 / "compare.csv").read_text())
    _same(old_csv, rows(kvbench("compare", "--format", "csv", cwd=tmp_path)), database)


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

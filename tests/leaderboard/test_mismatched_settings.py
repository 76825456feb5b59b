"""An arm on other problems than the null is named by its setting: a policy with two parameter settings
marks only the setting that ran other problems, and each mismatched setting keeps its own phrase."""

from __future__ import annotations

import json
import time
from pathlib import Path

import duckdb
import pyarrow as pa

from kvbench.bench.leaderboard import _SAMPLES, synthetic_spec
from kvbench.leaderboard.queries import Compression, leaderboard
from kvbench.store.ingest import SCHEMA
from kvbench.store.manifest import RunManifest
from kvbench.store.records import SCHEMA_VERSION, RunRecord, arrow_schema

ARMS = [  # run id, policy, params, role, problems
    ("w1", "streaming", {"window": 1}, "policy", 10),
    ("w2", "streaming", {"window": 2}, "policy", 10),
    ("w3", "streaming", {"window": 3}, "policy", 4),
    ("w4", "streaming", {"window": 4}, "policy", 6),
    ("null", "random", {}, "null", 10),
    ("full", "full", {}, "reference", 10),
]


def _store(path: Path) -> None:
    con = duckdb.connect(str(path))
    try:
        con.execute(SCHEMA)
        con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
        runs = []
        for index, (run_id, policy, params, role, problems) in enumerate(ARMS):
            reference = role == "reference"
            spec = synthetic_spec(
                model="synthetic", task="task-0", protocol="protect-prompt", policy=policy, samples=1,
                budget=None if reference else 256, n_avg=1024, ratio=None if reference else 4.0,
            )  # fmt: skip
            spec["policy"]["params"] = params
            manifest = {"run_id": run_id, "role": role, "label": run_id, "kvbench": "synthetic", "spec": spec}
            typed = RunManifest.validated({**manifest, "created": time.time() + index}, path)
            runs.append(RunRecord.from_manifest(typed).row())
            values = {"run_id": run_id, "task": "task-0", "chance": 300 + 50 * index}
            con.execute(_SAMPLES, values | {"problems": problems, "samples": 1})
        con.register("new_runs", pa.Table.from_pylist(runs, schema=arrow_schema(RunRecord)))
        con.execute("INSERT INTO runs BY NAME SELECT * FROM new_runs")
    finally:
        con.close()


def test_only_the_settings_on_other_problems_are_marked_each_with_its_phrase(tmp_path: Path) -> None:
    database = tmp_path / "settings.duckdb"
    _store(database)
    table = leaderboard(database, "synthetic", "protect-prompt", Compression(4.0, None))
    marks = {
        (json.loads(arm.params)["window"], row["problems × samples"])
        for arm, (_, row) in zip(table.arms, table.frame.iterrows(), strict=True)
        if arm.policy == "streaming"
    }
    assert marks == {
        (1, "10 × 1"),
        (2, "10 × 1"),
        (3, "4 × 1 ≠ null"),
        (4, "6 × 1 ≠ null"),
    }
    assert sorted(table.mismatched) == [
        "streaming (window=3) scored 4 problems, the null 10, both 4",
        "streaming (window=4) scored 6 problems, the null 10, both 6",
    ]

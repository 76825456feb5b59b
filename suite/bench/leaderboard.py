"""How fast the leaderboard renders as the database grows: synthetic stores of the runner's schema.

The rows are random but well-formed (the ingest schema, one run per model × task × policy × budget,
the null and the full cache included), so the app's queries and statistics do their real work.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

from kvbench.runner.ingest import SCHEMA, SCHEMA_VERSION

_RUN = """
INSERT INTO runs (run_id, role, label, adapter, device, dtype, attention, model, task, task_version, policy,
                  policy_params, protocol, budget, buffer, n_avg, ratio, samples_per_problem, protocol_seed,
                  visibility, kvbench_version, created, spec)
VALUES (?, ?, ?, 'hf', 'cpu', 'float32', 'sdpa', 'synthetic', ?, 1, ?, '{}', 'protect-prompt',
        ?, 64, 1024, ?, ?, 0, 'public',
        'synthetic', ?, ?)
"""


def synthetic_store(
    path: Path, *, policies: int, tasks: int = 4, problems: int = 50, samples: int = 4
) -> int:
    """Write a database with ``policies`` policies under test; returns its number of sample rows."""
    con = duckdb.connect(str(path))
    try:
        con.execute(SCHEMA)
        con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
        arms = [(f"policy-{i:02d}", "policy") for i in range(policies)] + [
            ("random", "null"),
            ("full", "reference"),
        ]
        spec = json.dumps({"synthetic": True})
        for t in range(tasks):
            for index, (policy, role) in enumerate(arms):
                run_id = f"{t:02d}-{policy}"
                budget = None if role == "reference" else 256
                ratio = None if role == "reference" else 4.0
                values = [run_id, role, f"synthetic/task-{t}/{policy}", f"task-{t}", policy, budget, ratio]
                con.execute(_RUN, [*values, samples, time.time(), spec])
                # a policy's chance of a correct sample rises with its index, so verdicts vary
                con.execute(
                    "INSERT INTO samples SELECT ?, ?, 'p' || p, md5('p' || p), s, p * 100 + s, "
                    "(hash(?, p, s) % 1000 < ?)::INTEGER::DOUBLE AS metric, metric > 0, metric > 0, 'stop', "
                    "NULL, "
                    "100 + (hash(p, s) % 900)::INTEGER, 3, '{\"no_answer\": false}', 'answer ' || p, 0.1 "
                    "FROM range(?) r(p), range(?) q(s)",
                    [run_id, f"task-{t}", run_id, 300 + 10 * index, problems, samples],
                )
        return con.execute("SELECT count(*) FROM samples").fetchone()[0]
    finally:
        con.close()


@dataclass(frozen=True)
class RenderTiming:
    label: str
    policies: int
    rows: int
    first_render_seconds: float
    cached_render_seconds: float


CASES = (
    ("1 policy", dict(policies=1, problems=50)),
    ("50 policies", dict(policies=50, problems=30)),
    ("100k sample rows", dict(policies=50, problems=125)),
)


def time_render(database: Path, label: str, policies: int, rows: int) -> RenderTiming:
    """Seconds for a fresh session to run the app script (queries, statistics, layout), then a rerun."""
    from streamlit.testing.v1 import AppTest

    import kvbench.leaderboard
    from kvbench.leaderboard.app import DATABASE_ENV

    app = Path(kvbench.leaderboard.__file__).with_name("app.py")
    os.environ[DATABASE_ENV] = str(database)
    started = time.perf_counter()
    test = AppTest.from_file(str(app), default_timeout=120).run()
    first = time.perf_counter() - started
    if test.exception:
        raise RuntimeError(f"the app failed on {label}: {test.exception[0].message}")
    started = time.perf_counter()
    test.run()
    return RenderTiming(label, policies, rows, first, time.perf_counter() - started)

"""How fast the leaderboard renders as the database grows: synthetic stores of the runner's schema.

The rows are random but well-formed (the ingest schema, one run per model × task × policy × budget,
the null and the full cache included), so the app's queries and statistics do their real work.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from kvbench.specs.model import load_model_spec
from kvbench.specs.protocol import FULL_CACHE_POLICY, NULL_POLICY, load_protocol
from kvbench.specs.resolved import ResolvedSpec, Role
from kvbench.specs.task import load_task
from kvbench.store.ingest import SCHEMA
from kvbench.store.manifest import RunManifest
from kvbench.store.records import SCHEMA_VERSION, RunRecord, arrow_schema

# a policy's chance of a correct sample rises with its index, so verdicts vary
_SAMPLES = """
INSERT INTO samples BY NAME
SELECT $run_id AS run_id, $task AS task, 'p' || p AS problem_id, md5('p' || p) AS problem_hash, s AS sample,
       p * 100 + s AS seed, (hash($run_id, p, s) % 1000 < $chance)::INTEGER::DOUBLE AS metric,
       metric > 0 AS correct, metric > 0 AS strict_correct, 'stop' AS finish_reason,
       100 + (hash(p, s) % 900)::INTEGER AS generated_tokens, 3 AS evictions, false AS no_answer,
       'synthetic' AS grader_version, 0.01 AS eviction_seconds, '{}' AS secondary, 'answer ' || p AS output,
       0.1 AS wall_seconds
FROM range($problems) r(p), range($samples) q(s)
"""


def synthetic_store(
    path: Path, *, policies: int, tasks: int = 4, problems: int = 50, samples: int = 4
) -> int:
    """Write a database with ``policies`` policies under test; returns its number of sample rows."""
    with duckdb.connect(str(path)) as con:
        con.execute(SCHEMA)
        con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
        arms = [(f"policy-{i:02d}", Role.POLICY) for i in range(policies)] + [
            (NULL_POLICY, Role.NULL),
            (FULL_CACHE_POLICY, Role.REFERENCE),
        ]
        runs = []
        for t in range(tasks):
            for index, (policy, role) in enumerate(arms):
                run_id = f"{t:02d}-{policy}"
                runs.append(_run(run_id, role, f"task-{t}", policy, samples))
                chance = 300 + 10 * index
                values = {"run_id": run_id, "task": f"task-{t}", "chance": chance}
                con.execute(_SAMPLES, values | {"problems": problems, "samples": samples})
        con.register("new_runs", pa.Table.from_pylist(runs, schema=arrow_schema(RunRecord)))
        con.execute("INSERT INTO runs BY NAME SELECT * FROM new_runs")
        return con.execute("SELECT count(*) FROM samples").fetchall()[0][0]


def _run(run_id: str, role: Role, task: str, policy: str, samples: int) -> dict:
    """One run's row, its columns read from its resolved spec as ingest reads a run's manifest."""
    reference = role == Role.REFERENCE
    spec = synthetic_spec(
        model="synthetic",
        task=task,
        protocol="protect-prompt",
        policy=policy,
        samples=samples,
        budget=None if reference else 256,
        n_avg=1024,
        ratio=None if reference else 4.0,
    )
    label = f"synthetic/{task}/{policy}"
    resolved = ResolvedSpec.read(spec, role)
    manifest = RunManifest(
        run_id=run_id, spec=resolved, role=role, label=label, kvbench="synthetic", created=time.time()
    )
    return RunRecord.from_manifest(manifest).row()


def synthetic_spec(
    *, model: str, task: str, protocol: str, policy: str, samples: int, budget: int | None, **fields: Any
) -> dict[str, Any]:
    """A resolved spec for a store written by hand: the shipped tiny-qwen3 model, passkey task and
    protect-prompt protocol under the names given, so that readers (the pairing rule) see what its
    columns say."""
    return {
        "runner_version": 1,
        "runtime": {"adapter": "hf", "device": "cpu", "dtype": "float32", "attention": "sdpa"},
        "model": load_model_spec("tiny-qwen3").model_copy(update={"name": model}).model_dump(mode="json"),
        "task": load_task("passkey").model_copy(update={"name": task}).model_dump(mode="json"),
        "policy": {"name": policy, "params": {}},
        "protocol": load_protocol("protect-prompt").model_copy(update={"name": protocol}).identity(),
        "budget": budget,
        "n_avg": fields.pop("n_avg", None),
        "ratio": fields.pop("ratio", None),
        "samples": samples,
        "limit": fields.pop("limit", None),
        **fields,
    }


@dataclass(frozen=True)
class RenderTiming:
    label: str
    policies: int
    rows: int
    first_render_seconds: float
    cached_render_seconds: float


CASES = (
    ("1 policy", dict(policies=1, problems=50), False),
    ("50 policies", dict(policies=50, problems=30), False),
    ("100k sample rows", dict(policies=50, problems=125), False),
    ("100k sample rows, public mode", dict(policies=50, problems=125), True),
)
"""(label, store shape, whether the app runs in public mode, as `kvbench leaderboard --public`)."""


def time_render(database: Path, label: str, policies: int, rows: int, public: bool = False) -> RenderTiming:
    """Seconds for a fresh session to run the app script (queries, statistics, layout), then a rerun."""
    from streamlit.testing.v1 import AppTest

    import kvbench.leaderboard
    from kvbench.leaderboard.app import DATABASE_ENV
    from kvbench.leaderboard.public import PUBLIC_ENV

    app = Path(kvbench.leaderboard.__file__).with_name("app.py")
    # the app learns its database and mode as under `kvbench leaderboard [--public]`
    setting = {DATABASE_ENV: str(database), PUBLIC_ENV: "1" if public else ""}
    saved = {name: os.environ.get(name) for name in setting}
    os.environ.update(setting)
    try:
        started = time.perf_counter()
        test = AppTest.from_file(str(app), default_timeout=120).run()
        first = time.perf_counter() - started
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value
    if test.exception:
        raise RuntimeError(f"the app failed on {label}: {test.exception[0].message}")
    started = time.perf_counter()
    test.run()
    return RenderTiming(label, policies, rows, first, time.perf_counter() - started)

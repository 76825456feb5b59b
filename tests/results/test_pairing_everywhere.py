"""One pairing rule everywhere: two fidelity sweeps whose first ratios differ, stored in one results folder,
read by `kvbench compare`, the leaderboard's queries and `kvbench export` (what `kvbench accept` checks).

The fidelity probe scores only the predictions after the first eviction event, which is at K + B: so even
the full cache's stored samples depend on K. Each run must be paired with the null and the full cache at
its own K; the test reads which slice each run scored (its ``scored_tokens``) straight from the shards.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from kvbench.commands.check import cell_key, collect
from kvbench.leaderboard.queries import Compression, leaderboard
from kvbench.results.compare import Filters, compare
from kvbench.results.comparison import stored_runs
from kvbench.results.pairing import partners
from kvbench.runner.cell import Cell
from kvbench.runner.orchestrate import run_cells
from kvbench.runner.plan import RunRequest, plan
from kvbench.specs.resolved import Role
from kvbench.store.ingest import ingest
from kvbench.submissions.contents import stored_runs as bundle_runs
from kvbench.submissions.export import select

SWEEP = """spec_version: 1
name: {name}
description: a fidelity sweep on the tiny model
models: [tiny-qwen3]
tasks: [fidelity]
policies: [streaming]
protocol: protect-prompt
ratios: {ratios}
limit: 1
"""


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Cell]]:
    root = tmp_path_factory.mktemp("sweeps")
    cells: list[Cell] = []
    for name, ratios in (("first", "[2, 3]"), ("second", "[3, 4]")):
        suite = root / f"{name}.yaml"
        suite.write_text(SWEEP.format(name=name, ratios=ratios))
        cells += run_cells(plan(RunRequest(suite=str(suite))), root / "runs", progress=False).cells
    ingest(root / "runs")
    return root / "runs", cells


@pytest.fixture(scope="module")
def store(sweeps: tuple[Path, list[Cell]]) -> Path:
    return sweeps[0]


def scored_tokens(out: Path) -> dict[str, int]:
    """Run id -> the predictions its samples scored, as the shards hold them."""
    con = duckdb.connect(str(out / "kvbench.duckdb"), read_only=True)
    rows = con.execute("SELECT run_id, secondary FROM samples").fetchall()
    con.close()
    return {run_id: json.loads(secondary)["scored_tokens"] for run_id, secondary in rows}


def test_every_fidelity_run_is_paired_with_the_full_cache_scored_at_its_own_budget(store: Path) -> None:
    con = duckdb.connect(str(store / "kvbench.duckdb"), read_only=True)
    runs = stored_runs(con)
    con.close()
    budgets = sorted({r.budget for r in runs if r.role != Role.REFERENCE})
    assert budgets == [256, 320, 512]  # K = 1024 / 4, / 3 (rounded down to B = 64), / 2
    scored = scored_tokens(store)
    tested = [r for r in runs if r.role != Role.REFERENCE]
    assert len(tested) == 6  # streaming and the null at each K, the shared K = 320 stored once
    for run in tested:
        full = partners(run.spec, runs)["full cache"]
        assert full is not None and full.spec.budget == run.budget
        assert scored[full.run_id] == scored[run.run_id], run.budget
    # a later K scores fewer predictions: had the sweeps shared one full cache, two K would disagree
    assert len({scored[r.run_id] for r in tested}) == 3


def test_compare_check_the_leaderboard_and_export_pair_every_run_alike(
    sweeps: tuple[Path, list[Cell]],
) -> None:
    store, cells = sweeps
    database = store / "kvbench.duckdb"
    con = duckdb.connect(str(database), read_only=True)
    runs = stored_runs(con)
    scores = dict(con.execute("SELECT run_id, avg(metric) FROM samples GROUP BY run_id").fetchall())
    con.close()
    policy = {r.budget: r for r in runs if r.role == Role.POLICY}
    null = {r.budget: r for r in runs if r.role == Role.NULL}
    full = {r.budget: r for r in runs if r.role == Role.REFERENCE}
    assert set(policy) == set(null) == set(full) == {256, 320, 512}

    # kvbench compare: at each K, the difference with the null at that K (one problem: the score itself)
    rows = compare(database, Filters())
    assert sorted(r["budget"] for r in rows) == [256, 320, 512]
    for row in rows:
        k = row["budget"]
        expected = scores[policy[k].run_id] - scores[null[k].run_id]
        assert row["delta"] == pytest.approx(expected, abs=1e-9)
        assert row["delta_full"] == pytest.approx(scores[policy[k].run_id] - scores[full[k].run_id], abs=1e-9)

    # the leaderboard: each compression's table holds the null and the full cache of that K
    for k, ratio in ((512, 2.0), (320, 3.0), (256, 4.0)):
        table = leaderboard(database, "tiny-qwen3", "protect-prompt", Compression(ratio=ratio, budget=None))
        assert set(table.run_ids) == {policy[k].run_id, null[k].run_id, full[k].run_id}

    # kvbench export (the bundle `kvbench accept` checks): each policy run travels with the same partners
    shards, _ = bundle_runs(store / "shards")
    chosen = {r.run_id for r in select(shards, [], ["streaming"])}
    assert chosen == {r.run_id for k in policy for r in (policy[k], null[k], full[k])}
    for k, run in policy.items():
        mine = next(s for s in shards if s.run_id == run.run_id)
        assert partners(mine.spec, shards)["null"].run_id == null[k].run_id
        assert partners(mine.spec, shards)["full cache"].run_id == full[k].run_id

    # kvbench check records, for every policy cell, the null and the full cache it is paired with
    unique = list({c.run_id: c for c in cells}.values())
    keys = {c.run_id: cell_key(c) for c in unique}
    checked = {r.identity: r for r in collect(unique, database)}
    for k, run in policy.items():
        assert checked[run.run_id].null == keys[null[k].run_id]
        assert checked[run.run_id].full == keys[full[k].run_id]
    assert len(set(keys.values())) == len(keys)  # the full caches at three K have three keys

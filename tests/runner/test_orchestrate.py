"""The settle-then-replan step lives in the orchestrator, not in an executor: an executor written here, that
only runs units (in reverse order, handing every row back), gets the same settled K and the same shards
as the local executor, on a suite whose budgets wait for the full arm's measured N_avg (toy adapter)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from toy_adapter import ToyAdapter

import kvbench.adapters.base as adapters
from kvbench.runner.cell import Cell
from kvbench.runner.execute import Replica
from kvbench.runner.executor import Prepared, Unit, UnitResult
from kvbench.runner.orchestrate import run_cells
from kvbench.runner.plan import RunRequest, plan

GSM8K = Path(__file__).parents[1] / "fixtures" / "hub" / "openai" / "gsm8k"
PROTOCOL = (Path(__file__).parents[2] / "suite" / "protocols" / "sink-only.yaml").read_text()
GENERATED = 96
"""The toy adapter never stops early: every sample generates exactly this many tokens."""
TIMED = {"wall_seconds", "eviction_seconds"}


class InTurnsExecutor:
    """The smallest executor: one loaded model, units run last to first, rows handed back to be stored.
    It knows nothing of budgets; it records the batches of units it was given."""

    def __init__(self) -> None:
        self.replica: Replica | None = None
        self.batches: list[list[Unit]] = []

    def prepare(self, cells: Sequence[Cell]) -> Prepared:
        if self.replica is None:
            self.replica = Replica(cells[0].model, cells[0].runtime, progress=False)
        return Prepared(self.replica.prepare(cells), {"executor": {"kind": "in-test"}})

    def run(self, units: Sequence[Unit], status: Callable[[str], None]) -> Iterator[UnitResult]:
        assert self.replica is not None
        self.batches.append(list(units))
        for unit in reversed(units):
            status(unit.problem_id)
            yield self.replica.score(unit)

    def close(self) -> None:
        if self.replica is not None:
            self.replica.close()


def _cells(tmp_path: Path, limit: int = 2, budget: int | None = None) -> list[Cell]:
    protocol = tmp_path / "b8.yaml"
    protocol.write_text(PROTOCOL.replace("name: sink-only", "name: b8").replace("buffer: 64", "buffer: 8"))
    request = RunRequest(
        models=("tiny-qwen3",),
        tasks=("gsm8k",),
        data=str(GSM8K),
        policies=("h2o",),
        protocol=str(protocol),
        samples=2,
        limit=limit,
        budget=budget,
        max_new_tokens=GENERATED,
        adapter="toy",
        attention="toy",
    )
    return plan(request)


def _untimed(row: dict) -> dict:
    secondary = {k: v for k, v in json.loads(row["secondary"]).items() if not k.endswith("seconds")}
    return {**{k: v for k, v in row.items() if k not in TIMED}, "secondary": secondary}


def _shards(out: Path) -> dict[tuple[str, str], list[dict]]:
    """(run id, shard file) -> its rows without timings, read straight from Parquet."""
    return {
        (path.parent.name, path.name): [_untimed(row) for row in pq.read_table(path).to_pylist()]
        for path in sorted(out.glob("shards/*/*.parquet"))
    }


def test_an_executor_that_only_runs_units_gets_the_settled_budgets_and_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(adapters.ADAPTERS.registered, "toy", ToyAdapter)
    cells = _cells(tmp_path)
    assert sorted(c.role for c in cells if c.pending is not None) == ["null", "policy"]
    local = run_cells(cells, tmp_path / "local", progress=False)
    mine = InTurnsExecutor()
    other = run_cells(cells, tmp_path / "other", mine, progress=False)

    # K from the full arm's stored lengths, by the protocol's rule: N_avg / 4 to a multiple of B = 8
    full = next(c for c in cells if c.role == "reference")
    stored = _shards(tmp_path / "local")
    lengths = [
        row["generated_tokens"] for (run, _), rows in stored.items() if run == full.run_id for row in rows
    ]
    assert len(lengths) == 2 * 2 and set(lengths) == {GENERATED}
    k = max(round(sum(lengths) / len(lengths) / 4 / 8) * 8, 2 * 8)
    assert k == 24  # not the declared N_avg's 2048 / 4
    for ran in (local.cells, other.cells):
        assert [(c.role, c.budget, c.pending) for c in ran] == [
            (c.role, k if c.pending else c.budget, None) for c in cells
        ]
    assert [c.run_id for c in other.cells] == [c.run_id for c in local.cells]

    # the executor saw the full arm's units first, then (after settling) the settled cells' units
    first, second = mine.batches
    assert {u.cell.run_id for u in first} == {c.run_id for c in cells if c.pending is None}
    assert {u.cell.run_id for u in second} == {c.run_id for c in other.cells if c.role != "reference"}
    assert all(u.cell.budget == k and u.cell.pending is None for u in second)

    assert _shards(tmp_path / "other") == _shards(tmp_path / "local")
    assert len(_shards(tmp_path / "local")) == 3 * 2  # arms × problems
    (measured,) = (tmp_path / "other" / "budgets").glob("*.json")
    assert json.loads(measured.read_text())["n_avg"] == GENERATED
    assert other.timings.computed == local.timings.computed == 6 and other.timings.reused == 0

    again = run_cells(cells, tmp_path / "other", InTurnsExecutor(), progress=False)
    assert again.timings.reused == 6 and again.timings.computed == 0
    assert [c.run_id for c in again.cells] == [c.run_id for c in local.cells]


def test_cells_of_one_task_at_two_limits_each_run_their_own_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One call with a task's cells at limit 1 and at limit 2 (as `kvbench verify` makes for a bundle that
    holds both): each cell runs its own problems, and a chosen problem beyond the smaller limit runs."""
    monkeypatch.setitem(adapters.ADAPTERS.registered, "toy", ToyAdapter)
    two, one = _cells(tmp_path, limit=2, budget=32), _cells(tmp_path, limit=1, budget=32)
    run_cells([*two, *one], tmp_path / "all", progress=False)
    held = Counter(run for run, _ in _shards(tmp_path / "all"))
    assert held == {**{c.run_id: 2 for c in two}, **{c.run_id: 1 for c in one}}

    policy = next(c for c in two if c.role == "policy")
    second = sorted(name for run, name in _shards(tmp_path / "all") if run == policy.run_id)[-1]
    problem = next(
        p for p in pq.read_table(tmp_path / "all" / "shards" / policy.run_id / second).column("problem_id")
    ).as_py()
    chosen = run_cells([*two, *one], tmp_path / "only", progress=False, only={policy.run_id: [problem]})
    # the chosen problem, and every problem of the cells `only` does not name
    assert chosen.timings.computed == 1 + 2 * (len(two) - 1) + len(one)
    assert (tmp_path / "only" / "shards" / policy.run_id / second).is_file()

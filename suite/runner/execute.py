"""Running cells: load each model once, check every cell before the first token, skip stored problems."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from kvbench.adapters.base import Backend, ended, find_adapter
from kvbench.core.calibration import QueryStats
from kvbench.core.seeding import sample_seed
from kvbench.errors import BudgetError
from kvbench.graders.registry import Grader, make_grader
from kvbench.provenance import provenance
from kvbench.registry import policy_documentation
from kvbench.results.records import SampleRecord
from kvbench.runner.budgets import check_measurable, settle_all
from kvbench.runner.plan import Cell
from kvbench.runner.sources import task_source
from kvbench.runner.store import ShardStore


@dataclass
class Timings:
    """Where the wall time of a run went (seconds)."""

    model_load: float = 0.0
    calibration: float = 0.0
    units: float = 0.0
    """Scoring problems: prefill, teacher-forced forwards and evictions."""
    eviction: float = 0.0
    """The part of ``units`` spent in eviction events."""
    ingest: float = 0.0
    computed: int = 0
    reused: int = 0
    by_cell: dict[str, float] = field(default_factory=dict)


def calibration_for(cell: Cell, backend: Backend, cache: dict, timings: Timings) -> QueryStats | None:
    if "calibration" not in cell.policy.needs:
        return None
    key = (cell.model, cell.runtime)
    if key not in cache:
        started = time.perf_counter()
        cache[key] = backend.calibrate()
        timings.calibration += time.perf_counter() - started
    return cache[key]


def cell_problems(cell: Cell, backend: Backend) -> list:
    """The problems of a cell's task, from its source: dataset rows (hub or --data), probes, documents."""
    data, fingerprint = (
        (None, None) if cell.data is None else (Path(cell.data), cell.resolved["data"]["sha256"])
    )
    return task_source(cell.task).problems(cell.task, backend, cell.limit, data, fingerprint)


def prompt_length(problem, backend: Backend) -> int:
    return len(problem.encoded(backend))


def check_cells(cells: Sequence[Cell], backend: Backend, problems: dict[str, list]) -> None:
    """Refuse, before anything runs, a cell whose budget cannot protect its prompts."""
    for cell in cells:
        schedule = cell.schedule()
        if not cell.policy.evicts:
            continue
        longest = max(prompt_length(p, backend) for p in problems[cell.task.name])
        prefix = schedule.protected_prefix(longest)
        if prefix.capped:
            raise BudgetError(
                f"{cell.label}: the budget K={schedule.budget} with buffer B={schedule.buffer} leaves "
                f"room to protect {prefix.count} prompt tokens, but task {cell.task.name!r} has prompts of "
                f"{longest} tokens on {cell.model.name}: use a budget of at least "
                f"{longest + schedule.buffer + 1} (--budget) or a smaller ratio (--ratio)"
            )


@dataclass(frozen=True)
class Completed:
    cells: list[Cell]
    """The cells as they ran: a budget that followed a measured N_avg is settled (its final identity)."""
    timings: Timings


def run_cells(
    cells: Sequence[Cell],
    out: Path,
    *,
    progress: bool = True,
    only: Mapping[str, Collection[str]] | None = None,
) -> Completed:
    """Run every cell, one model (the spec the cells were planned with) at a time; skip stored problems.

    Cells whose K follows the full cache's measured N_avg run after the full arm of their model and task.
    ``only`` (run id -> problem ids) runs just those problems of a cell: `kvbench verify`'s subset.
    """
    check_measurable(cells, out)
    timings = Timings()
    calibrations: dict[str, QueryStats] = {}
    graders = Graders()
    ran: dict[str, Cell] = {}
    try:
        for model, runtime in dict.fromkeys((c.model, c.runtime) for c in cells):
            model_cells = [c for c in cells if (c.model, c.runtime) == (model, runtime)]
            extra = provenance(runtime.device)
            ran |= _run_model(model_cells, out, progress, extra, calibrations, timings, graders, only or {})
    finally:
        graders.close()
    return Completed(cells=[ran[c.run_id] for c in cells], timings=timings)


class Graders:
    """One grader per name for a whole run (the math grader keeps a worker process), closed at its end."""

    def __init__(self) -> None:
        self._made: dict[str, Grader] = {}

    def __getitem__(self, name: str) -> Grader:
        if name not in self._made:
            self._made[name] = make_grader(name)
        return self._made[name]

    def close(self) -> None:
        for grader in self._made.values():
            grader.close()


def score_unit(cell: Cell, backend: Backend, problem, calibration, graders: Graders) -> list[SampleRecord]:
    """The sample rows of one unit of work: one problem of one cell, its samples decoded as one batch."""
    seeds = [
        sample_seed(cell.protocol.seed, cell.task.name, problem.problem_id, s) for s in range(cell.samples)
    ]
    return task_source(cell.task).score(cell, backend, problem, seeds, calibration, graders)


def _run_model(
    model_cells: list[Cell],
    out: Path,
    progress: bool,
    extra: dict,
    calibrations: dict,
    timings: Timings,
    graders: Graders,
    only: Mapping[str, Collection[str]],
) -> dict[str, Cell]:
    """Run one model's cells; returns each planned cell's run id -> the cell as it ran."""
    spec, runtime = model_cells[0].model, model_cells[0].runtime
    started = time.perf_counter()
    adapter = find_adapter(runtime.adapter)
    backend = adapter.load(spec, device=runtime.device, attention=runtime.attention, progress=progress)
    timings.model_load += time.perf_counter() - started
    with ended(backend):
        problems = {c.task.name: cell_problems(c, backend) for c in model_cells}
        ready = [c for c in model_cells if c.pending is None]
        check_cells(ready, backend, problems)
        total = sum(len(problems[c.task.name]) for c in model_cells)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, disable=not progress, transient=True) as bar:
            running = _ModelRun(
                backend,
                out,
                extra,
                calibrations,
                timings,
                graders,
                bar,
                bar.add_task(spec.name, total=total),
                only,
            )
            for cell in ready:  # the full arms among them, whose lengths set the pending budgets
                running.run(cell, problems[cell.task.name])
            ids = {name: [p.problem_id for p in found] for name, found in problems.items()}
            as_ran = settle_all(model_cells, out, ids)
            settled = [after for before, after in zip(model_cells, as_ran, strict=True) if before.pending]
            check_cells(settled, backend, problems)
            for cell in settled:
                running.run(cell, problems[cell.task.name])
        return {before.run_id: after for before, after in zip(model_cells, as_ran, strict=True)}


def manifest_notes(cell: Cell) -> dict:
    """What a run's manifest records beside its spec and provenance."""
    return {
        "role": cell.role,
        "label": cell.label,
        "policy_doc": policy_documentation(cell.policy),
        "thinking": cell.model.thinking,  # how `kvbench grade` reads its outputs again
        "suite": cell.suite,  # what a submission's bundle ships and `kvbench accept` checks
    }


@dataclass
class _ModelRun:
    """What every cell of one loaded model shares while it runs."""

    backend: Backend
    out: Path
    provenance: dict
    calibrations: dict
    timings: Timings
    graders: Graders
    bar: Progress
    bar_task: TaskID
    only: Mapping[str, Collection[str]]

    def run(self, cell: Cell, problems: list) -> None:
        """Score every problem the cell has not stored; each problem's shard is written whole."""
        store = ShardStore(self.out, cell.run_id)
        store.write_manifest(cell.resolved, {**self.provenance, **manifest_notes(cell)})
        timings = self.timings
        calibration = calibration_for(cell, self.backend, self.calibrations, timings)
        chosen = self.only.get(cell.run_id)
        for problem in problems:
            if chosen is not None and problem.problem_id not in chosen:
                self.bar.advance(self.bar_task)
                continue
            self.bar.update(self.bar_task, description=f"{cell.label} {problem.problem_id}")
            if store.has(problem.problem_id):
                timings.reused += 1
            else:
                started = time.perf_counter()
                rows = score_unit(cell, self.backend, problem, calibration, self.graders)
                store.write(problem.problem_id, rows)
                spent = time.perf_counter() - started
                timings.eviction += sum(r.eviction_seconds for r in rows)
                timings.units += spent
                timings.by_cell[cell.label] = timings.by_cell.get(cell.label, 0.0) + spent
                timings.computed += 1
            self.bar.advance(self.bar_task)

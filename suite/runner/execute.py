"""Running units in this process: a model loaded once (a `Replica`, as in each Ray actor), each cell
checked before its first token. The orchestrator (kvbench.runner.orchestrate) decides what runs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kvbench.adapters.base import Backend, ended, find_adapter
from kvbench.core.seeding import sample_seed
from kvbench.errors import BudgetError
from kvbench.graders.registry import Graders
from kvbench.provenance import provenance
from kvbench.runner.cell import Cell, Runtime
from kvbench.runner.executor import Prepared, Unit, UnitResult
from kvbench.runner.memory import DeviceFacts, free_memory
from kvbench.runner.sources import Problem, task_source
from kvbench.specs.model import ModelSpec
from kvbench.store.records import SampleRecord


def cell_problems(cell: Cell, backend: Backend) -> Sequence[Problem]:
    """The problems of a cell's task, from its source: dataset rows (hub or --data), probes, documents."""
    local = cell.spec.data  # a --data copy, recorded with the content the run's identity follows
    data, fingerprint = (None, None) if local is None else (Path(local.path), local.sha256)
    return task_source(cell.task).problems(cell.task, backend, cell.limit, data, fingerprint)


def score_unit(
    cell: Cell, backend: Backend, problem: Problem, calibration: Any, graders: Graders, batch: int | None
) -> list[SampleRecord]:
    """The sample rows of one unit of work: one problem of one cell, its samples decoded at most ``batch``
    at a time (None: all at once)."""
    seeds = [
        sample_seed(cell.protocol.seed, cell.task.name, problem.problem_id, s) for s in range(cell.samples)
    ]
    return task_source(cell.task).score(cell, backend, problem, seeds, calibration, graders, batch)


class Replica:
    """One model loaded, with what scoring its units needs: its problems by task, graders, calibration."""

    def __init__(self, model: ModelSpec, runtime: Runtime, *, progress: bool = True) -> None:
        adapter = find_adapter(runtime.adapter)
        # the memory plan's device, read before the weights take theirs; only for an adapter kvbench plans
        # for (vllm plans its own, and its engine starts CUDA in processes of its own)
        self.free = free_memory(runtime.device) if hasattr(adapter, "shape") else None
        started = time.perf_counter()
        load = adapter.load
        self.backend = load(model, device=runtime.device, attention=runtime.attention, progress=progress)
        self.load_seconds = time.perf_counter() - started
        self.key = (model, runtime)
        self.graders = Graders()
        self.calibration: Any = None  # the model's query statistics, computed once if a policy needs them
        self.problems: dict[tuple[str, int | None, str | None], dict[str, Problem]] = {}
        self.longest: dict[tuple[str, int | None, str | None], int] = {}  # by the problems' key

    def _problems(self, cell: Cell) -> dict[str, Problem]:
        key = (cell.task.name, cell.limit, cell.data)
        if key not in self.problems:
            self.problems[key] = {p.problem_id: p for p in cell_problems(cell, self.backend)}
        return self.problems[key]

    def prepare(self, cells: Sequence[Cell]) -> dict[str, list[str]]:
        """Each cell's problem ids by run id (cells of one task may differ in limit or data), after refusing,
        before anything runs, a cell whose budget cannot protect the prompts its protocol protects (a
        pending budget is checked once settled)."""
        problems = {c.run_id: list(self._problems(c).values()) for c in cells}
        for cell in cells:
            checked = cell.pending is None and cell.policy.evicts
            if not checked and task_source(cell.task).teacher_forced:
                continue  # neither refused for its prompts nor memory-planned
            longest = self._longest(cell, problems[cell.run_id])
            if not checked:
                continue
            schedule = cell.schedule()
            prefix = schedule.capped_prompt(longest)
            if prefix is not None:
                raise BudgetError(
                    f"{cell.label}: the budget K={schedule.budget} with buffer B={schedule.buffer} leaves "
                    f"room to protect {prefix.count} prompt tokens, but task {cell.task.name!r} has prompts "
                    f"of {longest} tokens on {cell.model.name}: use a budget of at least "
                    f"{longest + schedule.buffer + 1} (--budget) or a smaller ratio (--ratio)"
                )
        return {name: [p.problem_id for p in found] for name, found in problems.items()}

    def _longest(self, cell: Cell, problems: Sequence[Problem]) -> int:
        """The cell's longest prompt in tokens, counted once per task (its cells share their problems)."""
        key = (cell.task.name, cell.limit, cell.data)
        if key not in self.longest:
            self.longest[key] = max((len(p.encoded(self.backend)) for p in problems), default=0)
        return self.longest[key]

    def device_facts(self, cells: Sequence[Cell]) -> DeviceFacts:
        """What the memory plan needs of this replica for prepared ``cells``: the model's shape, the
        device's free memory before the model loaded, each generation cell's longest prompt."""
        generating = [c for c in cells if not task_source(c.task).teacher_forced]
        return DeviceFacts(
            shape=getattr(self.backend, "shape", None),
            device=self.key[1].device,
            free=self.free,
            prompt_tokens={c.run_id: self.longest[c.task.name, c.limit, c.data] for c in generating},
        )

    def score(self, unit: Unit) -> UnitResult:
        """The unit's rows, timed."""
        cell, calibrating, needs = unit.cell, 0.0, "calibration" in unit.cell.policy.needs
        if needs and self.calibration is None:
            started = time.perf_counter()
            self.calibration = self.backend.calibrate()
            calibrating = time.perf_counter() - started
        calibration, problem = self.calibration if needs else None, self._problems(cell)[unit.problem_id]
        started = time.perf_counter()
        rows = score_unit(cell, self.backend, problem, calibration, self.graders, unit.batch)
        return UnitResult(
            unit,
            tuple(rows),
            seconds=time.perf_counter() - started,
            eviction=sum(r.eviction_seconds for r in rows),
            calibration=calibrating,
        )

    def close(self) -> None:
        with ended(self.backend):  # a backend with processes of its own (vllm) ends after the graders
            self.graders.close()


class LocalExecutor:
    """This process: one model loaded at a time, its units run in turn (kvbench.runner.executor)."""

    def __init__(self, *, progress: bool = True) -> None:
        self.progress = progress
        self.loaded: list[Replica] = []  # the one loaded model, or none

    def prepare(self, cells: Sequence[Cell]) -> Prepared:
        key, load = (cells[0].model, cells[0].runtime), 0.0
        if not self.loaded or self.loaded[0].key != key:
            self.close()
            self.loaded.append(Replica(*key, progress=self.progress))
            load = self.loaded[0].load_seconds
        replica = self.loaded[0]
        return Prepared(replica.prepare(cells), provenance(key[1].device), load, replica.device_facts(cells))

    def run(self, units: Sequence[Unit], status: Callable[[str], None]) -> Iterator[UnitResult]:
        for unit in units:
            status(f"{unit.cell.label} {unit.problem_id}")
            yield self.loaded[0].score(unit)

    def close(self) -> None:
        while self.loaded:
            self.loaded.pop().close()

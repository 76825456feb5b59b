"""Running cells, written once for every executor (which only runs units): plan -> settle -> units -> store.

Per model, the cells with a known budget run (the full arms among them), then each pending cell is
settled on its full arm's measured N_avg, checked and run; stored units are skipped, manifests written."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from kvbench.errors import KvbenchError, SpecError
from kvbench.printable import printable
from kvbench.registry import policy_documentation
from kvbench.runner.budgets import check_measurable, settle_all
from kvbench.runner.cell import Cell
from kvbench.runner.eta import Eta, UnitKind
from kvbench.runner.executor import Executor, Prepared, Unit
from kvbench.runner.memory import ArmPlan, MemoryLimits, MemoryPlan, plan_memory
from kvbench.runner.paces import machine_key, record, stored
from kvbench.runner.sources import task_source
from kvbench.specs.resolved import ResolvedSpec
from kvbench.store.manifest import RunManifest
from kvbench.store.shards import ShardStore, read_records


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


@dataclass(frozen=True)
class Completed:
    cells: list[Cell]
    """The cells as they ran: a budget that followed a measured N_avg is settled (its final identity)."""
    timings: Timings


def run_cells(
    cells: Sequence[Cell],
    out: Path,
    executor: Executor | None = None,
    *,
    progress: bool = True,
    only: Mapping[str, Collection[str]] | None = None,
    memory: MemoryLimits | None = None,
    show_plan: Callable[[MemoryPlan], None] | None = None,
    say: Callable[[str], object] = print,
) -> Completed:
    """Run every cell on ``executor`` (default: this process), one model at a time; skip stored problems.

    Cells whose K follows the full cache's measured N_avg run after the full arm of their model and task.
    ``only`` (run id -> problem ids) runs just those problems of a cell: `kvbench verify`'s subset.
    Before a model's first unit, ``say`` gets the plan's line (the units, and the time they will take
    here by earlier runs' paces) and a line for each --limit beyond what a task holds.
    Each model's generation cells are planned against the device's memory before their first token
    (kvbench.runner.memory, bounded by ``memory``); ``show_plan`` sees a plan that bounds anything.
    """
    check_measurable(cells, out)
    if executor is None:
        from kvbench.runner.execute import LocalExecutor

        executor = LocalExecutor(progress=progress)
    run = _Run(executor, out, only or {}, progress, memory or MemoryLimits(), show_plan, say)
    ran: dict[str, Cell] = {}
    try:
        for key in dict.fromkeys((c.model, c.runtime) for c in cells):
            ran |= run.model([c for c in cells if (c.model, c.runtime) == key])
    finally:
        executor.close()
    return Completed(cells=[ran[c.run_id] for c in cells], timings=run.timings)


def manifest(cell: Cell, provenance: Mapping[str, Any], arm: ArmPlan | None) -> RunManifest:
    """A run's manifest: its spec, what it is, where it ran (``provenance``, the executor's) and the
    micro-batch its first run had (provenance, never identity); a bundle ships its suite."""
    notes = {"run_id": cell.run_id, "spec": cell.spec, "role": cell.role, "label": cell.label}
    notes |= {"policy_doc": policy_documentation(cell.policy), "suite": cell.suite, "created": time.time()}
    notes["thinking"] = cell.model.thinking  # how `kvbench grade` reads its outputs again
    plan = {"memory_plan": arm.record()} if arm is not None else {}
    return RunManifest.model_validate({**provenance, **notes, **plan})


@dataclass
class _Run:
    executor: Executor
    out: Path
    only: Mapping[str, Collection[str]]
    progress: bool
    memory: MemoryLimits = field(default_factory=MemoryLimits)
    show_plan: Callable[[MemoryPlan], None] | None = None
    say: Callable[[str], object] = print
    timings: Timings = field(default_factory=Timings)
    lines: bool = False
    eta: Eta = field(default_factory=lambda: Eta([]))
    computing: float = 0.0
    """Wall seconds this model's units have taken so far: the ETA's scale from unit seconds to wall."""
    planned: bool = False
    """Whether this model's plan line was said."""
    finished: list[tuple[str, bool, float, float]] = field(default_factory=list)
    """This model's finished units (task, evicts, seconds, tokens), for the paces kept between runs."""

    def model(self, cells: list[Cell]) -> dict[str, Cell]:
        """One model's cells, ready ones first, then settled ones; planned run id -> the cell as it ran."""
        prepared = self.executor.prepare(cells)
        self.timings.model_load += prepared.load_seconds
        for line in _limit_notes(cells, prepared):
            self.say(line)
        ready = [c for c in cells if c.pending is None]
        plan = self._plan(ready, prepared)
        # the description names a model, a task and a label, which a bundle's spec chooses (`kvbench
        # verify`): never read as Rich markup, and printable() where it is set
        description = TextColumn("{task.description}", markup=False)
        columns = (description, BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        # piped to a file, a live bar shows nothing for the whole run: one line per finished unit instead
        self.lines = self.progress and not Console().is_terminal
        shown_at_all = self.progress and not self.lines
        with Progress(*columns, _Countdown(), disable=not shown_at_all, transient=True) as bar:
            chosen = [(c, self._chosen(c, prepared)) for c in cells]
            # every unit of the model, the pending cells' too (they run after their full arms)
            machine, model = machine_key(cells[0].runtime.device), cells[0].model.name
            prior = stored(machine, model)
            self.eta = Eta([_kind(Unit(c, p)) for c, problems in chosen for p in problems], prior)
            self.computing, self.planned, self.finished = 0.0, False, []
            total = sum(len(problems) for _, problems in chosen)
            shown = (bar, bar.add_task(printable(cells[0].model.name), total=total, finish=None))
            try:
                failures = self._units(ready, prepared, plan, *shown)
            finally:
                record(machine, model, self.finished)
                self.finished = []
            as_ran = settle_all(cells, self.out, prepared.problems)
            settled = [after for before, after in zip(cells, as_ran, strict=True) if before.pending]
            if settled:
                # the settled budgets against the prompts and the memory; settled cells have their own ids
                again = self.executor.prepare(settled)
                try:
                    failures += self._units(settled, again, self._plan(settled, again), *shown)
                finally:
                    record(machine, model, self.finished)
        if failures:
            raise KvbenchError(
                f"{len(failures)} unit(s) failed; the stored ones are kept and a rerun computes only what is "
                "missing:\n  " + "\n  ".join(failures[:20])
            )
        return {before.run_id: after for before, after in zip(cells, as_ran, strict=True)}

    def _plan_line(self, model: str, stored_units: int) -> str:
        """The units left to compute and, by earlier runs' paces on this machine, their time."""
        left, model = sum(count for count in self.eta.pending.values() if count > 0), printable(model)
        head = f"plan: {left} unit(s) of {model} to compute ({stored_units} stored)"
        seconds = self.eta.left()
        if left == 0:
            return f"{head}: nothing to compute"
        if seconds is None:
            return (
                f"{head}; no earlier run of {model} on this machine to time them by: the time left shows "
                "once the first unit ends"
            )
        return f"{head}: about {_clock(seconds)} on this machine, by earlier runs' paces here"

    def _chosen(self, cell: Cell, prepared: Prepared) -> list[str]:
        chosen = self.only.get(cell.run_id)
        return [p for p in prepared.problems[cell.run_id] if chosen is None or p in chosen]

    def _plan(self, cells: list[Cell], prepared: Prepared) -> MemoryPlan | None:
        """The memory plan of ``cells`` on the prepared replica, shown where it bounds anything; refused
        (BudgetError) where one sample of an arm does not fit."""
        if prepared.device is None or not cells:
            return None
        plan = plan_memory(cells, prepared.device, self.memory)
        if plan is not None and plan.limited and self.show_plan is not None:
            self.show_plan(plan)
        return plan

    def _units(
        self, cells: list[Cell], prepared: Prepared, plan: MemoryPlan | None, bar: Progress, task: TaskID
    ) -> list[str]:
        """Every chosen unit of ``cells`` not stored yet, run and stored; returns the failed ones."""
        units, failures, timings = [], [], self.timings
        for cell in cells:
            store = ShardStore(self.out, cell.run_id)
            arm = plan.arm(cell.run_id) if plan is not None else None
            manifest(cell, prepared.provenance, arm).write(store.manifest)
            smaller = other_limits(self.out, cell.spec)
            for problem_id in self._chosen(cell, prepared):
                if store.has(problem_id) or copied(problem_id, smaller, store):
                    timings.reused += 1
                    bar.advance(task)
                    self.eta.skipped(_kind(Unit(cell, problem_id)))
                else:
                    units.append(Unit(cell, problem_id, arm.batch if arm is not None else None))
        # a problem's cells one after another: a teacher-forced probe's full-cache predictions are made
        # once per problem and read by every policy after the first (adapters/hf/teacher.py)
        tasks = {name: i for i, name in enumerate(dict.fromkeys(cell.task.name for cell in cells))}
        order = {
            (cell.task.name, problem): (tasks[cell.task.name], i)
            for cell in cells
            for i, problem in enumerate(prepared.problems[cell.run_id])
        }
        units.sort(key=lambda unit: order[unit.cell.task.name, unit.problem_id])
        if not self.planned:
            self.planned = True
            self.say(self._plan_line(cells[0].model.name if cells else "", timings.reused))
        began, computing = time.perf_counter(), self.computing
        for result in self.executor.run(units, lambda text: bar.update(task, description=printable(text))):
            cell, problem_id = result.unit.cell, result.unit.problem_id
            self.computing = computing + time.perf_counter() - began
            if result.error is None:
                kind = _kind(result.unit)
                self.eta.finished(kind, result.seconds)
                self.finished.append((kind.task, kind.evicts, result.seconds, kind.tokens))
            else:
                self.eta.skipped(_kind(result.unit))
            # in wall seconds: executors may run several units at once
            left = self.eta.left(self.computing)
            bar.update(task, advance=1, finish=None if left is None else time.monotonic() + left)
            if self.lines:
                line = _unit_line(bar.tasks[task], f"{cell.label} {problem_id}", result.seconds, left)
                print(line if result.error is None else f"{line} FAILED", flush=True)
            if result.error is not None:
                failures.append(f"{cell.label} {problem_id}: {result.error}"[:500])
                continue
            if result.rows is not None:
                ShardStore(self.out, cell.run_id).write(problem_id, result.rows)
            timings.computed += int(result.computed)
            timings.units += result.seconds
            timings.eviction += result.eviction
            timings.calibration += result.calibration
        return failures


def _limit_notes(cells: Sequence[Cell], prepared: Prepared) -> list[str]:
    """A line per task whose --limit asks for more problems than it holds (all it holds run), or more than
    a probe declares (the probe makes the rest)."""
    notes = {}
    for cell in cells:
        held, limit, task = len(prepared.problems[cell.run_id]), cell.limit, cell.task
        name = printable(task.name)  # a bundle's spec names it (`kvbench verify`)
        if limit is None or (task.name, limit) in notes:
            continue
        declared = task_source(task).made_to_order(task)
        if declared is not None and limit > declared:
            notes[task.name, limit] = (
                f"task {name} is a probe of {declared} problems: a limit of {limit} makes "
                f"{limit - declared} more, each seeded by its index"
            )
        elif held < limit:
            notes[task.name, limit] = f"task {name} holds {held} problems: a limit of {limit} runs them all"
    return list(notes.values())


def other_limits(out: Path, spec: ResolvedSpec) -> list[ShardStore]:
    """The stored runs of the same cell at another ``--limit``: their identity differs only in the limit,
    and a problem's samples depend on the problem, never on how many others ran (its seeds come from the
    protocol seed, task, problem and sample), so a problem they hold is this cell's too. A manifest that
    does not read back is passed over."""
    found = []
    for path in sorted((out / "shards").glob("*/manifest.json")):
        with contextlib.suppress(SpecError):
            stored = RunManifest.read(path)
            if stored.run_id != spec.identity and stored.spec.without("limit") == spec.without("limit"):
                found.append(ShardStore(out, stored.run_id))
    return found


def copied(problem_id: str, stores: list[ShardStore], into: ShardStore) -> bool:
    """Copy ``problem_id``'s samples from the first of ``stores`` that holds them into ``into``, under
    ``into``'s run id; False when none holds them."""
    for store in stores:
        if store.has(problem_id):
            records = [
                r.model_copy(update={"run_id": into.run_id}) for r in read_records(store.shard(problem_id))
            ]
            into.write(problem_id, records)
            return True
    return False


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def _unit_line(progress: Task, unit: str, seconds: float, left: float | None) -> str:
    """``[done/total] unit: its seconds; elapsed, ETA`` for a log: what a bar shows on a terminal. The
    unit's name (a label, a problem id) is printable(): a bundle's spec chooses it."""
    done, total = int(progress.completed), int(progress.total or 0)
    name = printable(unit)
    return f"[{done}/{total}] {name}: {seconds:.1f} s; elapsed {_clock(progress.elapsed)}, ETA {_clock(left)}"


def _kind(unit: Unit) -> UnitKind:
    return UnitKind(unit.cell.task.name, unit.cell.policy.evicts, unit.cost)


class _Countdown(ProgressColumn):
    """``ETA h:mm:ss`` counting down to the time the Eta last gave (rich's own column assumes one pace for
    every unit)."""

    def render(self, task: Task) -> Text:
        finish = task.fields.get("finish")
        left = None if finish is None else max(0.0, finish - time.monotonic())
        return Text(f"ETA {_clock(left)}", style="progress.remaining")

"""The executor contract: what the orchestrator (kvbench.runner.orchestrate) asks of whatever runs units.

An executor only loads a model, lists a cell's problems and scores units. Planning, settling budgets on
the measured N_avg, skipping stored units, manifests and timings are the orchestrator's, written once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvbench.runner.cell import Cell
from kvbench.runner.memory import DeviceFacts
from kvbench.store.records import SampleRecord


@dataclass(frozen=True)
class Unit:
    """One problem of one cell, its samples decoded together (in micro-batches where memory asks)."""

    cell: Cell
    problem_id: str
    batch: int | None = None
    """At most this many of its samples decode at once (None: all), as the memory plan chose: a run
    setting, never identity, since every sample's draws come from its own seed."""

    @property
    def cost(self) -> float:
        """Its samples × their expected length: an executor with many workers starts costly units first."""
        task = self.cell.task
        return self.cell.samples * float(task.reference_n_avg(self.cell.model.name) or task.max_new_tokens)


@dataclass(frozen=True)
class UnitResult:
    unit: Unit
    rows: tuple[SampleRecord, ...] | None
    """The rows for the orchestrator to store; None when the executor wrote the shard, or failed."""
    computed: bool = True
    """False when the shard was there already (a retry of a unit whose first attempt landed)."""
    seconds: float = 0.0
    eviction: float = 0.0
    calibration: float = 0.0
    error: str | None = None
    """Why the unit failed after the executor's retries: named at the end, computed by the next run."""


@dataclass(frozen=True)
class Prepared:
    problems: dict[str, list[str]]
    """Each cell's problem ids in order, by run id: two cells of one task may differ in limit or data."""
    provenance: dict[str, Any]
    """What a manifest records of the machine and executor."""
    load_seconds: float = 0.0
    device: DeviceFacts | None = None
    """What the memory plan needs of the replica (kvbench.runner.memory); None: no plan."""


class Executor(Protocol):
    """Called with the cells of one model (and runtime) at a time."""

    def prepare(self, cells: Sequence[Cell]) -> Prepared:
        """Load the model unless loaded, list the problems, refuse a settled budget that cannot protect
        its prompts."""

    def run(self, units: Sequence[Unit], status: Callable[[str], None]) -> Iterator[UnitResult]:
        """Each unit's result as it lands; ``status`` tells the user what runs."""

    def close(self) -> None: ...

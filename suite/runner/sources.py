"""Task sources: where a task's problems come from and how one is scored into sample rows, by ``source.kind``.

A hub dataset (or a --data copy of it), a teacher-forced probe and an lm-eval task each implement
:class:`TaskSource`, so the runner asks the task's source and branches on no kind. Built-in kinds are
``"module:Class"`` names imported on first use (the lm-eval source lives in kvbench.lmeval, which builds on
the runner, so the runner never imports it); a package adds a kind under the entry-point group
``kvbench.task_sources``, and its task YAMLs name it as ``source.kind``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from kvbench.adapters.base import Backend, Generation, TeacherForced
from kvbench.graders.registry import Graders
from kvbench.plugins import Registry
from kvbench.runner.cell import Cell
from kvbench.specs.task import TaskSpec
from kvbench.store.records import SampleRecord
from kvbench.store.shards import problem_key


class Problem(Protocol):
    """One problem of a task: what the runner reads of every source's problems."""

    @property
    def problem_id(self) -> str: ...

    def encoded(self, backend: Backend) -> list[int]:
        """Its prompt's token ids on ``backend`` (the longest sets the memory plan and the budget check)."""
        ...


P = TypeVar("P", bound=Problem)


class TaskSource(Protocol[P]):
    """One kind of task source, over its own kind of problem. A source that subclasses this takes its
    defaults."""

    teacher_forced: bool = False
    """Its units are teacher-forced: the adapter must offer teacher forcing."""
    measured_n_avg: bool = True
    """K = N_avg/ratio follows the full arm's measured generated length; False: N_avg is the task's exact
    trace length, known before anything runs."""
    local_data: bool = False
    """``--data`` can replace its dataset with a local copy."""

    def resolve(self, task: TaskSpec) -> TaskSpec:
        """The task with what its source fills in where the YAML leaves it (before command-line overrides);
        a source refuses here, before anything loads, a task whose source fields it cannot read."""
        return task

    def identity(self, task: TaskSpec) -> dict[str, Any]:
        """What of the source, beyond the task spec, enters every cell's identity."""
        return {}

    def made_to_order(self, task: TaskSpec) -> int | None:
        """The problems this source makes when no limit is given, where it makes as many as asked (a
        probe: a larger limit makes more, each seeded by its index); None where it holds what it holds."""
        return None

    def check_data(self, task: TaskSpec, data: Path) -> None:
        """Refuse, before anything loads, a local copy (``--data``) whose rows this source cannot read;
        only a source with ``local_data`` is asked."""

    def problems(
        self,
        task: TaskSpec,
        backend: Backend | None,
        limit: int | None,
        data: Path | None,
        fingerprint: str | None,
    ) -> Sequence[P]:
        """The task's problems (at most ``limit``); ``data``, with its recorded ``fingerprint``, replaces
        the hub."""
        ...

    def score(
        self,
        cell: Cell,
        backend: Backend,
        problem: P,
        seeds: list[int],
        calibration: Any,
        graders: Graders,
        batch: int | None = None,
    ) -> list[SampleRecord]:
        """The sample rows of one problem of a cell, one per seed (:func:`unit_fields` gives the fields
        they share); a generating source decodes at most ``batch`` samples at once (the memory plan's
        micro-batch; None: all), a teacher-forced one ignores it (its passes are not planned)."""
        ...


TASK_SOURCES: Registry[Callable[[], TaskSource[Any]]] = Registry(
    "task source",
    "kvbench.task_sources",
    {
        "hub-dataset": "kvbench.runner.generation_units:HubSource",
        "probe": "kvbench.runner.probe_units:ProbeTaskSource",
        "lm-eval": "kvbench.lmeval.tasks:LmEvalTaskSource",
    },
)


def task_source(task: TaskSpec) -> TaskSource[Any]:
    """The source of a task, by its ``source.kind``."""
    return TASK_SOURCES.get(task.source.kind)()


def resolved_task(task: TaskSpec) -> TaskSpec:
    """The task as it runs, its source's defaults filled in (an lm-eval task is loaded and checked)."""
    return task_source(task).resolve(task)


def unit_fields(
    cell: Cell, problem_id: str, result: Generation | TeacherForced, seconds: float, rows: int
) -> dict[str, Any]:
    """The fields every sample record of a unit shares (``rows`` samples decoded as one batch, in
    ``seconds`` each): its cell and problem, its timings, budget and memory. The budget is None for the
    full cache."""
    held = result.kv_budget if cell.policy.evicts else None
    return {
        "run_id": cell.run_id,
        "task": cell.task.name,
        "problem_id": problem_id,
        "problem_hash": problem_key(problem_id),
        "eviction_seconds": result.eviction_seconds / rows,
        "wall_seconds": seconds,
        "kv_budget_tokens": held.tokens if held is not None else None,
        "kv_budget_bytes": held.bytes if held is not None else None,
        "kv_peak_bytes": result.peak_kv_bytes // max(rows, 1),
    }

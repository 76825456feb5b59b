"""Task sources: where a task's problems come from and how one is scored, found by ``source.kind``.

A hub dataset (or a --data copy of it), a teacher-forced probe and an lm-eval task each implement
:class:`TaskSource`, so the runner asks the task's source and branches on no kind; a new kind is one class
and one line here. Entries are ``"module:Class"`` names imported on first use, as the grader registry's
are: the lm-eval source lives in kvbench.lmeval, which builds on the runner, so the runner never imports it.
"""

from __future__ import annotations

import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kvbench.adapters.base import Backend
    from kvbench.runner.execute import Graders
    from kvbench.runner.plan import Cell
    from kvbench.specs.task import TaskSpec
    from kvbench.store.records import SampleRecord

SOURCES = {
    "hub-dataset": "kvbench.runner.generation_units:HubSource",
    "probe": "kvbench.runner.probe_units:ProbeTaskSource",
    "lm-eval": "kvbench.lmeval.tasks:LmEvalTaskSource",
}


class TaskSource(Protocol):
    """One kind of task source. Its problems have a ``problem_id`` and their prompt's token ids,
    ``encoded(backend)``. A source that subclasses this takes its defaults."""

    teacher_forced: bool = False
    """Its units are teacher-forced: the adapter must offer teacher forcing."""
    measured_n_avg: bool = True
    """K = N_avg/ratio follows the full arm's measured generated length; False: N_avg is the task's exact
    trace length, known before anything runs."""
    local_data: bool = False
    """``--data`` can replace its dataset with a local copy."""

    def resolve(self, task: TaskSpec) -> TaskSpec:
        """The task with what its source fills in where the YAML leaves it (before command-line overrides)."""
        return task

    def identity(self, task: TaskSpec) -> dict[str, Any]:
        """What of the source, beyond the task spec, enters every cell's identity."""
        return {}

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
    ) -> list:
        """The task's problems (at most ``limit``); ``data``, with its recorded ``fingerprint``, replaces
        the hub."""
        ...

    def score(
        self,
        cell: Cell,
        backend: Backend,
        problem: Any,
        seeds: list[int],
        calibration: Any,
        graders: Graders,
        batch: int | None = None,
    ) -> list[SampleRecord]:
        """The sample rows of one problem of a cell, one per seed; a generating source decodes at most
        ``batch`` samples at once (the memory plan's micro-batch; None: all), a teacher-forced one ignores
        it (its passes are not planned)."""
        ...


def task_source(task: TaskSpec) -> TaskSource:
    """The source of a task, by its ``source.kind``."""
    return pkgutil.resolve_name(SOURCES[task.source.kind])()


def resolved_task(task: TaskSpec) -> TaskSpec:
    """The task as it runs, its source's defaults filled in (an lm-eval task is loaded and checked)."""
    return task_source(task).resolve(task)

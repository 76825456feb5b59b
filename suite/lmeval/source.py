"""lm-eval tasks as a task source: lm-eval's documents are the problems, decoded and graded like a hub
dataset's (kvbench.runner.sources finds this class by name)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvbench.errors import SpecError
from kvbench.lmeval.tasks import loaded, resolved_spec
from kvbench.runner.generation_units import HubSource
from kvbench.specs.task import TaskSpec
from kvbench.specs.task_data import Problem


class LmEvalTaskSource(HubSource):
    local_data = False

    def resolve(self, task: TaskSpec) -> TaskSpec:
        return resolved_spec(task)

    def identity(self, task: TaskSpec) -> dict[str, Any]:
        """lm-eval's version, the task's version, config and documents."""
        return {"lm_eval": loaded(task).identity()}

    def problems(
        self, task: TaskSpec, backend: Any, limit: int | None, data: Path | None, fingerprint: str | None
    ) -> list[Problem]:
        if data is not None:
            raise SpecError(
                f"task {task.name!r} reads an lm-eval task, whose YAML names its data: --data does not apply"
            )
        return loaded(task).problems(limit)

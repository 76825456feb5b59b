"""The task-source seam: every kind a task YAML can name has exactly one source, and what the planner and
the runner read from it (teacher forcing, measured N_avg, --data) is what that kind of task does."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from kvbench.errors import SpecError
from kvbench.runner.sources import TASK_SOURCES, task_source
from kvbench.specs.task import TaskSpec, load_task

SUITE = Path(__file__).resolve().parents[2] / "suite"


def declared_kinds() -> set[str]:
    """The `source.kind` values the task spec types itself, read from its pydantic union (any other kind
    is an installed source's)."""
    union = typing.get_args(TaskSpec.model_fields["source"].annotation)
    members = [typing.get_args(member)[0].model_fields["kind"].annotation for member in union]
    return {typing.get_args(kind)[0] for kind in members if typing.get_origin(kind) is typing.Literal}


def lm_eval_task() -> TaskSpec:
    return TaskSpec.model_validate(
        {
            "name": "echo",
            "description": "an lm-eval task",
            "source": {"kind": "lm-eval", "task": "kvb_echo"},
            "metric": "bleu",
        }
    )


def test_every_declared_kind_has_one_source() -> None:
    assert set(TASK_SOURCES.builtins()) == declared_kinds() == {"probe", "hub-dataset", "lm-eval"}


@pytest.mark.parametrize(
    ("task", "teacher_forced", "measured_n_avg", "local_data"),
    [("passkey", True, False, False), ("gsm8k", False, True, True), (None, False, True, False)],
)
def test_each_kind_says_how_it_runs(
    task: str | None, teacher_forced: bool, measured_n_avg: bool, local_data: bool
) -> None:
    source = task_source(load_task(task) if task else lm_eval_task())
    assert (source.teacher_forced, source.measured_n_avg, source.local_data) == (
        teacher_forced,
        measured_n_avg,
        local_data,
    )


def test_an_lm_eval_task_refuses_local_data_before_loading_lm_eval(tmp_path: Path) -> None:
    task = lm_eval_task()
    with pytest.raises(SpecError, match="--data does not apply"):
        task_source(task).problems(task, None, None, tmp_path, None)


def test_the_runner_and_the_specs_branch_on_no_source_kind() -> None:
    """The one place that reads `source.kind` is the registry (and the spec's own validation)."""
    readers = sorted(
        str(path.relative_to(SUITE))
        for path in [*(SUITE / "runner").glob("*.py"), *(SUITE / "specs").glob("*.py")]
        if "source.kind" in path.read_text()
    )
    assert readers == ["runner/sources.py", "specs/task.py"]

"""Scoring reasoning problems: the k samples decode as one batch under the policy, then each is graded.

Per sample: correct, strict (correct and finished before the cap), no answer, truncated, generated
length, eviction count. A private task's output text is never stored; only its problem id and hash.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvbench.adapters.base import Backend, Sampling
from kvbench.graders.registry import Grader
from kvbench.runner.budgets import budget_fields
from kvbench.runner.graded import graded_fields
from kvbench.runner.plan import Cell
from kvbench.runner.sources import TaskSource
from kvbench.specs.task import TaskSpec
from kvbench.specs.task_data import Problem, check_data, load_problems
from kvbench.store.records import SampleRecord
from kvbench.store.shards import problem_key

if TYPE_CHECKING:
    from kvbench.runner.execute import Graders


class HubSource(TaskSource):
    """A hub dataset's rows (or a --data copy of them) as problems; each is decoded, then graded."""

    local_data = True

    def check_data(self, task: TaskSpec, data: Path) -> None:
        check_data(task, data)

    def problems(
        self, task: TaskSpec, backend: Any, limit: int | None, data: Path | None, fingerprint: str | None
    ) -> list[Problem]:
        return load_problems(task, data, limit, fingerprint)

    def score(
        self,
        cell: Cell,
        backend: Backend,
        problem: Problem,
        seeds: list[int],
        calibration: Any,
        graders: Graders,
    ) -> list[SampleRecord]:
        grader = graders[cell.task.grader]
        return score_generation(
            cell, backend, problem, seeds, run_id=cell.run_id, calibration=calibration, grader=grader
        )


def score_generation(
    cell: Cell,
    backend: Backend,
    problem: Problem,
    seeds: list[int],
    *,
    run_id: str,
    calibration: Any,
    grader: Grader,
) -> list[SampleRecord]:
    started = time.perf_counter()
    settings = cell.protocol.sampling[cell.model.family]
    sampling = problem.sampling or Sampling(settings.temperature, settings.top_p, settings.top_k)
    result = backend.generate(
        problem.encoded(backend),
        cell.policy,
        cell.schedule(),
        sample_seeds=seeds,
        sampling=sampling,
        max_new_tokens=cell.task.max_new_tokens,
        calibration=calibration,
        refuse_capped_prompt=True,
        stop_strings=problem.stop,
    )
    seconds = (time.perf_counter() - started) / len(seeds)
    rows = []
    for i, (seed, sample) in enumerate(zip(seeds, result.samples, strict=True)):
        verdict = grader.grade(sample.text, problem.gold, cell.task, thinking=cell.model.thinking)
        rows.append(
            SampleRecord(
                run_id=run_id,
                task=cell.task.name,
                problem_id=problem.problem_id,
                problem_hash=problem_key(problem.problem_id),
                sample=i,
                seed=seed,
                finish_reason=sample.finish_reason,
                generated_tokens=sample.generated,
                evictions=sample.evictions,
                eviction_seconds=result.eviction_seconds / len(seeds),
                wall_seconds=seconds,
                **graded_fields(verdict, sample.text, sample.finish_reason, cell.task),
                **budget_fields(cell, result.kv_budget, result.peak_kv_bytes, len(seeds)),
            )
        )
    return rows

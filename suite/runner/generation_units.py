"""Scoring reasoning problems: the k samples decode under the policy, as one batch or in the micro-batches
the memory plan chose (kvbench.runner.memory), then each is graded.

Per sample: correct, strict (correct and finished before the cap), no answer, truncated, generated
length, eviction count. A private task's output text is never stored; only its problem id and hash.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kvbench.adapters.base import Backend, Sampling
from kvbench.graders.registry import Graders, GraderVerdict
from kvbench.runner.cell import Cell
from kvbench.runner.memory import micro_batches
from kvbench.runner.sources import TaskSource, unit_fields
from kvbench.specs.task import TaskSpec
from kvbench.specs.task_data import Problem, check_data, load_problems
from kvbench.store.records import SampleRecord


class HubSource(TaskSource[Problem]):
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
        batch: int | None = None,
    ) -> list[SampleRecord]:
        grader = graders[cell.task.grader]
        settings = cell.protocol.sampling[cell.model.family]
        sampling = problem.sampling or Sampling(settings.temperature, settings.top_p, settings.top_k)
        prompt = problem.encoded(backend)
        rows = []
        for part in micro_batches(len(seeds), batch):
            started = time.perf_counter()
            result = backend.generate(
                prompt,
                cell.policy,
                cell.schedule(),
                sample_seeds=seeds[part.start : part.stop],
                sampling=sampling,
                max_new_tokens=cell.task.max_new_tokens,
                calibration=calibration,
                refuse_capped_prompt=True,
                stop_strings=problem.stop,
            )
            # timings and peak memory are this micro-batch's, shared among its rows
            seconds = (time.perf_counter() - started) / len(part)
            shared = unit_fields(cell, problem.problem_id, result, seconds, len(part))
            for i, sample in zip(part, result.samples, strict=True):
                verdict = grader.grade(sample.text, problem.gold, cell.task, thinking=cell.model.thinking)
                rows.append(
                    SampleRecord(
                        **shared,
                        sample=i,
                        seed=seeds[i],
                        finish_reason=sample.finish_reason,
                        generated_tokens=sample.generated,
                        evictions=sample.evictions,
                        **graded_fields(verdict, sample.text, sample.finish_reason, cell.task),
                        **(sample.retention.record_fields() if sample.retention is not None else {}),
                    )
                )
        return rows


def graded_fields(verdict: GraderVerdict, output: str, finish_reason: str, task: TaskSpec) -> dict[str, Any]:
    """The SampleRecord fields a verdict decides, once: a run grading each sample as it is generated and
    `kvbench grade` grading stored outputs again both store what this says, so a re-grade with an
    unchanged grader changes nothing (a partial-credit metric stays the score, never the 0/1 of
    ``correct``). A sample cut off at the token cap is never strictly correct; a private task stores
    neither its output nor the grader's detail (which may quote either)."""
    truncated = finish_reason == "length"
    public = task.visibility == "public"
    secondary: dict[str, Any] = {"truncated": truncated}
    if public:
        secondary["detail"] = verdict.detail
        secondary.update(verdict.extra)
    return {
        "metric": verdict.score,
        "correct": verdict.correct,
        "strict_correct": verdict.correct and not truncated,
        "reason": verdict.reason,
        "no_answer": verdict.no_answer,
        "grader_version": verdict.version,
        "secondary": secondary,
        "output": output if public else None,
    }

"""Verdict -> stored sample, once: a run grading each sample as it is generated and `kvbench grade`
grading stored outputs again both store what this function says, so a re-grade with an unchanged grader
changes nothing (a partial-credit metric stays the score, never the 0/1 of ``correct``)."""

from __future__ import annotations

from typing import Any

from kvbench.graders.registry import Verdict
from kvbench.specs.task import TaskSpec


def graded_fields(verdict: Verdict, output: str, finish_reason: str, task: TaskSpec) -> dict[str, Any]:
    """The SampleRecord fields a verdict decides. A sample cut off at the token cap is never strictly
    correct; a private task stores neither its output nor the grader's detail (which may quote either)."""
    truncated = finish_reason == "length"
    public = task.visibility == "public"
    secondary: dict[str, Any] = {"truncated": truncated}
    if public:
        secondary["detail"] = verdict.detail
        secondary.update(getattr(verdict, "extra", {}))
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

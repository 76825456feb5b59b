"""Grading a sample of an lm-eval task with the task's own filter and metric (``grader: lm-eval``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvbench.graders.thinking import final_answer

GRADER_VERSION = "lm-eval-1"


@dataclass(frozen=True)
class LmEvalVerdict:
    score: float
    """The task's metric for this sample (``metric`` of the kvbench task)."""
    correct: bool
    """Full credit: the metric's maximum of 1 (exact match, accuracy); a partial score is not correct."""
    no_answer: bool
    detail: str | None
    """The answer after the task's filter: what the metric read."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Every metric the task computed, stored with the sample."""
    version: str = GRADER_VERSION

    @property
    def reason(self) -> str | None:
        if self.correct:
            return None
        return "no answer" if self.no_answer else "partial credit" if self.score > 0 else "wrong answer"


class LmEvalGrader:
    """The metric named by the kvbench task, from lm-eval's ``process_results`` on the filtered answer.

    A thinking model's output is graded on its text after ``</think>``, as every kvbench grader does; an
    output that never closes its thinking has no answer and scores 0.
    """

    def problem(self, task: Any, row: dict[str, Any], problem_id: str, question: str) -> tuple[str, dict]:
        raise TypeError("lm-eval tasks build their problems in kvbench.lmeval.tasks")

    def grade(self, output: str, gold: dict[str, Any], task: Any, *, thinking: bool) -> LmEvalVerdict:
        answer = final_answer(output, thinking=thinking)
        if answer is None:
            return LmEvalVerdict(score=0.0, correct=False, no_answer=True, detail=None)
        scored = gold["loaded"].score(answer, gold["doc"])
        metrics = scored["metrics"]
        value = float(metrics[task.metric])
        filtered = scored["filtered"]
        return LmEvalVerdict(
            score=value,
            correct=value >= 1.0,
            no_answer=not str(filtered).strip(),
            detail=str(filtered),
            extra={"lm_eval_metrics": metrics},
        )

    def close(self) -> None:
        pass

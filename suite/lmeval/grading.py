"""Grading a sample of an lm-eval task with the task's own filter and metric (``grader: lm-eval``)."""

from __future__ import annotations

from typing import Any

from kvbench.graders.registry import Grader, GraderVerdict
from kvbench.graders.thinking import final_answer

GRADER_VERSION = "lm-eval-1"


class LmEvalGrader(Grader):
    """The metric named by the kvbench task, from lm-eval's ``process_results`` on the filtered answer.

    A thinking model's output is graded on its text after ``</think>``, as every kvbench grader does; an
    output that never closes its thinking has no answer and scores 0.
    """

    def problem(self, task: Any, row: dict[str, Any], problem_id: str, question: str) -> tuple[str, dict]:
        raise TypeError("lm-eval tasks build their problems in kvbench.lmeval.tasks")

    def grade(self, output: str, gold: dict[str, Any], task: Any, *, thinking: bool) -> GraderVerdict:
        answer = final_answer(output, thinking=thinking)
        if answer is None:
            return GraderVerdict(False, True, None, GRADER_VERSION)
        scored = gold["loaded"].score(answer, gold["doc"])
        metrics = scored["metrics"]
        value = float(metrics[task.metric])
        filtered = scored["filtered"]
        return GraderVerdict(
            value >= 1.0,
            not str(filtered).strip(),
            str(filtered),
            GRADER_VERSION,
            metric=value,
            extra={"lm_eval_metrics": metrics},
        )

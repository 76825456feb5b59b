"""The math grader: math-verify on the final answer, in worker processes with an outer timeout.

math-verify's own timeouts use signals, which work only in a process's main thread; and sympy can
still hang on a pathological expression. So every answer is verified in a worker process of a pool,
with a wall-clock limit around it: a worker that overruns is killed with its pool and the answer is
graded wrong (reason ``grader timeout``), and the next answer gets a fresh pool. Nothing stops the run.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.pool import Pool
from typing import Any, Literal

from kvbench.graders.registry import GraderVerdict
from kvbench.graders.thinking import final_answer

GRADER_VERSION = "math-1 (math-verify 0.9)"
AnswerKind = Literal["latex", "integer"]


def gold_after(text: str, marker: str | None) -> str:
    """The text after the last ``marker`` (GSM8K's '####') without thousands separators, or all of it."""
    return text.rsplit(marker, 1)[-1].strip().replace(",", "") if marker else text


def _verify(gold: str, answer: str, kind: AnswerKind) -> tuple[bool, str | None]:
    """Runs in a worker: parse gold and prediction (boxed first), then verify."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    if kind == "integer":
        gold_parsed = parse(gold, [ExprExtractionConfig(), LatexExtractionConfig()])
    else:
        gold_parsed = parse(f"${gold}$", [LatexExtractionConfig()])
    # the last box wins: math-verify would otherwise read several boxes as one set
    last_box = answer.rfind("\\boxed")
    answer = answer[last_box:] if last_box >= 0 else answer
    predicted = parse(answer, [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()])
    if not predicted:
        return False, None
    return bool(verify(gold_parsed, predicted)), str(predicted[-1])


class MathGrader:
    """The ``math`` grader: the gold answer from the task's ``answer`` column (after ``answer_after``,
    GSM8K's '####'), the final answer compared by math-verify in a worker process. Use as a context
    manager to release the workers."""

    def __init__(self, timeout: float = 20.0, workers: int = 1) -> None:
        self.timeout, self.workers = timeout, workers
        self._pool: Pool | None = None

    def __enter__(self) -> MathGrader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def problem(self, task: Any, row: dict[str, Any], problem_id: str, question: str) -> tuple[str, dict]:
        fields = task.source.fields
        answer = gold_after(str(row[fields.answer]), fields.answer_after)
        return task.prompt.replace("{question}", question), {"answer": answer}

    def grade(self, output: str, gold: dict[str, Any], task: Any, *, thinking: bool) -> GraderVerdict:
        return self.grade_answer(output, gold["answer"], kind=task.answer_kind, thinking=thinking)

    def grade_answer(
        self, output: str, gold: str, *, kind: AnswerKind = "latex", thinking: bool = False
    ) -> GraderVerdict:
        """The verdict on ``output``'s final answer against the gold value ``gold``."""
        answer = final_answer(output, thinking=thinking)
        if answer is None or not answer.strip():
            return GraderVerdict(False, True, None, GRADER_VERSION)
        if self._pool is None:
            self._pool = multiprocessing.get_context("spawn").Pool(self.workers)
        pending = self._pool.apply_async(_verify, (gold, answer, kind))
        try:
            correct, extracted = pending.get(timeout=self.timeout)
        except multiprocessing.TimeoutError:
            self.close()  # the worker may be stuck in sympy: kill it with its pool
            return GraderVerdict(False, False, None, GRADER_VERSION, failure="grader timeout")
        return GraderVerdict(correct, extracted is None, extracted, GRADER_VERSION)

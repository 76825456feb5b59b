"""Multiple choice (GPQA): choices shuffled with a fixed per-problem seed, the letter mapped back.

The reference data lists the correct answer first; a run never sees that order: ``shuffled_choices`` is
the only way a prompt is built, and it records the order with the result.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvbench.core.seeding import stable_seed
from kvbench.graders.registry import Grader, GraderVerdict
from kvbench.graders.thinking import final_answer

GRADER_VERSION = "choice-1"
LETTERS = "ABCD"
_BOXED = re.compile(r"\\boxed\{\s*(?:\\text(?:bf)?\{)?\s*\(?([A-Da-d])\)?\s*\}?\s*\}")
_PAREN = re.compile(r"\(([A-D])\)")


@dataclass(frozen=True)
class Shuffled:
    choices: tuple[str, ...]
    answer: str
    """The letter of the correct choice after shuffling."""
    order: tuple[int, ...]
    """order[i] = index in (correct, *incorrect) of the choice shown as letter i."""


def shuffled_choices(correct: str, incorrect: Sequence[str], problem_id: str, seed: int = 0) -> Shuffled:
    options = [correct, *incorrect]
    order = list(range(len(options)))
    random.Random(stable_seed("choices", seed, problem_id)).shuffle(order)
    return Shuffled(tuple(options[i] for i in order), LETTERS[order.index(0)], tuple(order))


def extract_letter(text: str) -> str | None:
    """The last ``\\boxed{X}`` (also ``\\boxed{(X)}``, ``\\boxed{\\text{X}}``), else the last ``(X)``."""
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].upper()
    plain = _PAREN.findall(text)
    return plain[-1] if plain else None


def grade_choice(output: str, answer: str, *, thinking: bool = False) -> GraderVerdict:
    """The verdict on the letter the grader read (its ``detail``)."""
    final = final_answer(output, thinking=thinking)
    letter = extract_letter(final) if final is not None else None
    return GraderVerdict(letter == answer, letter is None, letter, GRADER_VERSION)


class ChoiceTaskGrader(Grader):
    """The ``choice`` grader: the options shuffled per problem (never the dataset's order), the letter
    after the thinking compared with the shuffled correct one."""

    def problem(self, task: Any, row: dict[str, Any], problem_id: str, question: str) -> tuple[str, dict]:
        fields = task.source.fields
        shuffled = shuffled_choices(
            str(row[fields.correct]), [str(row[c]) for c in fields.incorrect], problem_id
        )
        choices = "\n".join(
            f"({letter}) {text}" for letter, text in zip(LETTERS, shuffled.choices, strict=False)
        )
        prompt = task.prompt.replace("{question}", question).replace("{choices}", choices)
        return prompt, {"answer": shuffled.answer, "order": list(shuffled.order)}

    def grade(self, output: str, gold: dict[str, Any], task: Any, *, thinking: bool) -> GraderVerdict:
        return grade_choice(output, gold["answer"], thinking=thinking)

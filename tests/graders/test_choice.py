"""The choice grader's table, and the shuffling that keeps the gold answer off position A."""

from __future__ import annotations

from collections import Counter

import pytest

from kvbench.graders.choice import extract_letter, grade_choice, shuffled_choices

# (model output, answer letter, thinking model, correct, no answer)
CASES = [
    (r"The answer is \boxed{B}", "B", False, True, False),
    (r"\boxed{(C)}", "C", False, True, False),
    (r"\boxed{\text{D}}", "D", False, True, False),
    (r"\boxed{\textbf{A}}", "A", False, True, False),
    (r"\boxed{b}", "B", False, True, False),
    (r"I think (A) at first, but \boxed{C}", "C", False, True, False),
    (r"\boxed{A} ... on reflection \boxed{D}", "D", False, True, False),
    (r"\boxed{A} ... on reflection \boxed{D}", "A", False, False, False),
    ("Between (A) and (B), the answer is (B).", "B", False, True, False),
    ("The answer is (B).", "C", False, False, False),
    ("I am not sure.", "A", False, False, True),
    (r"\boxed{E}", "A", False, False, True),
    (r"<think>(A) looks right</think> Final: \boxed{B}", "B", True, True, False),
    (r"<think>surely \boxed{B}</think> so (C)", "B", True, False, False),
    (r"<think>thinking forever \boxed{B}", "B", True, False, True),
    (r"\boxed{ (D) }", "D", False, True, False),
]


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 15


@pytest.mark.parametrize(("output", "answer", "thinking", "correct", "no_answer"), CASES)
def test_choice_verdict(output: str, answer: str, thinking: bool, correct: bool, no_answer: bool) -> None:
    verdict = grade_choice(output, answer, thinking=thinking)
    assert (verdict.correct, verdict.no_answer) == (correct, no_answer), verdict


def test_shuffle_is_seeded_per_problem_and_maps_back() -> None:
    first = shuffled_choices("right", ["w1", "w2", "w3"], "rec-1")
    assert first == shuffled_choices("right", ["w1", "w2", "w3"], "rec-1")
    assert first.choices["ABCD".index(first.answer)] == "right"
    assert [("right", "w1", "w2", "w3")[i] for i in first.order] == list(first.choices)
    positions = Counter(shuffled_choices("right", ["a", "b", "c"], f"rec-{i}").answer for i in range(400))
    assert set(positions) == set("ABCD") and min(positions.values()) > 60  # never stuck at A


def test_extract_letter_prefers_the_last_box() -> None:
    assert extract_letter(r"(A) \boxed{B} (C)") == "B"

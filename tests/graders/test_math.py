"""The math grader's table: each case with the verdict a careful human grader would give."""

from __future__ import annotations

import time

import pytest

from kvbench.graders.math import MathGrader

# (model output, gold, answer kind, thinking model, correct, no answer)
CASES = [
    (r"so \boxed{\frac{1}{2}}", r"\frac{1}{2}", "latex", False, True, False),
    (r"\boxed{0.5}", r"\frac{1}{2}", "latex", False, True, False),
    (r"\boxed{\dfrac{1}{2}}", r"\frac12", "latex", False, True, False),
    (r"\boxed{\tfrac{3}{4}}", "0.75", "latex", False, True, False),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}", "latex", False, True, False),
    (r"\boxed{\frac{1}{\frac{2}{3}}}", r"\frac{3}{2}", "latex", False, True, False),
    (r"first \boxed{3} then \boxed{5}", "5", "latex", False, True, False),
    (r"first \boxed{5} then \boxed{3}", "5", "latex", False, False, False),
    (r"\boxed{\frac{1}{2}} and finally \boxed{\frac13}", r"\frac{1}{3}", "latex", False, True, False),
    (r"\boxed{5\text{ cm}}", "5", "latex", False, True, False),
    (r"\boxed{18 \text{ dollars}}", "18", "integer", False, True, False),
    (r"\boxed{\$18}", "18", "latex", False, True, False),
    (r"\boxed{90^\circ}", "90", "latex", False, True, False),
    (r"\boxed{10\%}", "10", "latex", False, True, False),
    (r"\boxed{(0, 1]}", "(0,1]", "latex", False, True, False),
    (r"\boxed{[0,1]}", "(0,1]", "latex", False, False, False),
    (r"\boxed{(-\infty, 2)}", r"(-\infty,2)", "latex", False, True, False),
    (r"\boxed{\infty}", r"\infty", "latex", False, True, False),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", "latex", False, True, False),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", "latex", False, True, False),
    (r"\boxed{3.14}", r"\pi", "latex", False, False, False),
    (r"\boxed{\frac{\pi}{2}}", r"\pi/2", "latex", False, True, False),
    (r"\boxed{x=3}", "3", "latex", False, True, False),
    (r"\boxed{\{1,2\}}", r"\{1,2\}", "latex", False, True, False),
    (r"\boxed{-\frac{1}{3}}", r"-\frac13", "latex", False, True, False),
    (r"\boxed{\frac{-1}{3}}", r"-\frac13", "latex", False, True, False),
    (r"\boxed{1/3}", r"\frac{1}{3}", "latex", False, True, False),
    (r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt{2}}{2}", "latex", False, True, False),
    (r"\boxed{10^{3}}", "1000", "latex", False, True, False),
    (r"\boxed{1{,}000}", "1000", "latex", False, True, False),
    (
        r"\boxed{\left(3, \frac{\pi}{2}\right)}",
        r"\left( 3, \frac{\pi}{2} \right)",
        "latex",
        False,
        True,
        False,
    ),
    (
        r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}",
        r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",
        "latex",
        False,
        True,
        False,
    ),
    (
        r"\boxed{\begin{pmatrix} 2 \\ 1 \end{pmatrix}}",
        r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",
        "latex",
        False,
        False,
        False,
    ),
    ("The answer is 204", "204", "integer", False, True, False),
    (r"\boxed{204}", "204", "integer", False, True, False),
    (r"\boxed{204.0}", "204", "integer", False, True, False),
    (r"\boxed{205}", "204", "integer", False, False, False),
    (r"\boxed{2^{10}}", "1024", "integer", False, True, False),
    (r"\boxed{1,000}", "1000", "integer", False, True, False),
    ("I cannot tell.", "42", "integer", False, False, True),
    (r"\boxed{}", "3", "latex", False, False, True),
    ("", "3", "latex", False, False, True),
    # thinking models: only what follows </think> is the answer
    (r"<think>maybe \boxed{7}</think> The answer is \boxed{8}.", "8", "integer", True, True, False),
    (r"<think>it is \boxed{8}</think> so \boxed{7}", "8", "integer", True, False, False),
    (r"<think>long reasoning, cut off before the end \boxed{8}", "8", "integer", True, False, True),
    (r"<think>a</think>", "8", "integer", True, False, True),
    # a pathological expression: sympy would hang on it; the grader must not
    (r"\boxed{9^{9^{9^{9^{9}}}}}", "1", "latex", False, False, False),
]


@pytest.fixture(scope="module")
def grader():
    with MathGrader(timeout=30) as instance:
        yield instance


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize(
    ("output", "gold", "kind", "thinking", "correct", "no_answer"),
    CASES,
    ids=[f"{i}:{c[0][:30]}" for i, c in enumerate(CASES)],
)
def test_math_verdict(
    grader: MathGrader, output: str, gold: str, kind: str, thinking: bool, correct: bool, no_answer: bool
) -> None:
    verdict = grader.grade_answer(output, gold, kind=kind, thinking=thinking)
    assert (verdict.correct, verdict.no_answer) == (correct, no_answer), verdict


def test_a_hanging_answer_is_cut_off_and_the_grader_goes_on() -> None:
    with MathGrader(timeout=0.5) as grader:
        started = time.perf_counter()
        verdict = grader.grade_answer(r"\boxed{9^{9^{9^{9^{9}}}}}", "1")
        assert time.perf_counter() - started < 10
        assert not verdict.correct and verdict.reason == "grader timeout"
        grader.timeout = 30
        assert grader.grade_answer(r"\boxed{\frac{1}{2}}", "0.5").correct  # a fresh pool

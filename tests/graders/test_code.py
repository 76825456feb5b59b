"""The code grader: the last fenced block is the answer, stdin and functional tests, reasons for failures.

Attacks on the sandbox are in test_sandbox.py."""

from __future__ import annotations

from kvbench.graders.code import CodeTest, Limits, _same_output, extract_code, grade_code
from support import needs_sandbox

LIMITS = Limits(cpu_seconds=2, wall_seconds=5, memory_bytes=512 << 20)
ADD = [CodeTest("3 4\n", "7\n", "stdin"), CodeTest("10 -2\n", "8\n", "stdin")]


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


@needs_sandbox
def test_a_correct_program_passes_and_a_wrong_one_fails() -> None:
    assert grade_code(fenced("a, b = map(int, input().split())\nprint(a + b)"), ADD, limits=LIMITS).correct
    verdict = grade_code(fenced("print(7)"), ADD, limits=LIMITS)
    assert not verdict.correct and verdict.reason == "test 1: wrong answer"


@needs_sandbox
def test_functional_problems_call_the_solution_method() -> None:
    tests = [CodeTest("[1, 2, 3]\n2", "[2, 4, 6]", "functional"), CodeTest("[]\n5", "[]", "functional")]
    good = "class Solution:\n    def scale(self, xs, k):\n        return [x * k for x in xs]"
    assert grade_code(fenced(good), tests, "scale", limits=LIMITS).correct
    faked = "print('[2, 4, 6]')\nclass Solution:\n    def scale(self, xs, k):\n        return None"
    assert not grade_code(fenced(faked), tests, "scale", limits=LIMITS).correct


def test_the_last_block_is_the_answer_and_no_block_is_no_answer() -> None:
    assert extract_code("```python\nprint(1)\n```\nbetter:\n```python\nprint(2)\n```") == "print(2)\n"
    # the last *python* block: a block of its output or a shell line after it is not the program
    assert extract_code("```Python\nprint(1)\n```\nwhich prints:\n```text\n1\n```") == "print(1)\n"
    assert extract_code("```py\nprint(1)\n```\nrun it with:\n```bash\npython a.py\n```") == "print(1)\n"
    assert extract_code("```\nprint(3)\n```") == "print(3)\n"  # a block that names no language
    two_after = "```python\nprint(1)\n```\n```text\n1\n```\nthen\n```text\n1\n```"
    assert extract_code(two_after) == "print(1)\n"  # a skipped block's closing fence opens nothing
    verdict = grade_code("I would add the numbers.", ADD, limits=LIMITS)
    assert verdict.no_answer and not verdict.correct
    assert grade_code("<think>```python\nprint(7)\n```", ADD, thinking=True, limits=LIMITS).no_answer


def test_outputs_compare_line_by_line_and_numbers_by_value() -> None:
    assert _same_output("  1.0 2\n3  \n\n", "1 2.00\n3")
    assert _same_output("yes\n", "yes")
    assert not _same_output("1 2\n3", "1 2")  # a missing line
    assert not _same_output("1.5 x", "1.50 y")  # words compare as text
    assert not _same_output("1 2", "1 3")
    assert not _same_output("sNaN", "1")  # a signalling NaN is not a number to compare

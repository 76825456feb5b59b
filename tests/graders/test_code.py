"""The code sandbox holds: every escape attempt is graded a failure within its limits, the grader unharmed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kvbench.graders.code import CodeTest, Limits, extract_code, grade_code

LIMITS = Limits(cpu_seconds=2, wall_seconds=5, memory_bytes=512 << 20)
ADD = [CodeTest("3 4\n", "7\n", "stdin"), CodeTest("10 -2\n", "8\n", "stdin")]


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


def test_a_correct_program_passes_and_a_wrong_one_fails() -> None:
    assert grade_code(fenced("a, b = map(int, input().split())\nprint(a + b)"), ADD, limits=LIMITS).correct
    verdict = grade_code(fenced("print(7)"), ADD, limits=LIMITS)
    assert not verdict.correct and verdict.failed == "test 1: wrong answer"


def test_functional_problems_call_the_solution_method() -> None:
    tests = [CodeTest("[1, 2, 3]\n2", "[2, 4, 6]", "functional"), CodeTest("[]\n5", "[]", "functional")]
    good = "class Solution:\n    def scale(self, xs, k):\n        return [x * k for x in xs]"
    assert grade_code(fenced(good), tests, "scale", limits=LIMITS).correct
    faked = "print('[2, 4, 6]')\nclass Solution:\n    def scale(self, xs, k):\n        return None"
    assert not grade_code(fenced(faked), tests, "scale", limits=LIMITS).correct


def test_the_last_block_is_the_answer_and_no_block_is_no_answer() -> None:
    assert extract_code("```python\nprint(1)\n```\nbetter:\n```python\nprint(2)\n```") == "print(2)\n"
    verdict = grade_code("I would add the numbers.", ADD, limits=LIMITS)
    assert verdict.no_answer and not verdict.correct
    assert grade_code("<think>```python\nprint(7)\n```", ADD, thinking=True, limits=LIMITS).no_answer


ESCAPES = {
    "infinite loop": "while True:\n    pass",
    "memory bomb": "x = bytearray(8 << 30)\nprint(7)",
    "fork bomb": "import os\nwhile True:\n    os.fork()",
    "subprocess": "import subprocess\nprint(subprocess.run(['echo', '7'], capture_output=True).stdout)",
    "network": "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\nprint(7)",
    "write outside": "open(os.path.expanduser('/tmp/kvbench-escaped.txt'), 'w').write('x')\nprint(7)",
    "parent environment": "print(os.environ.get('KVBENCH_SECRET', 'none'))",
    "parent environment via /proc": "print(open(f'/proc/{os.getppid()}/environ').read())",
    "exit before the tests": "import sys\nsys.exit(0)",
    "sleeping": "import time\ntime.sleep(60)",
}


@pytest.mark.parametrize("name", list(ESCAPES))
def test_escape_attempts_fail_within_their_limits(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVBENCH_SECRET", "hunter2")
    escaped = Path("/tmp/kvbench-escaped.txt")
    escaped.unlink(missing_ok=True)
    tests = [CodeTest("", "hunter2" if "environment" in name else "7", "stdin")]
    started = time.perf_counter()
    verdict = grade_code(fenced("import os\n" + ESCAPES[name]), tests, limits=LIMITS)
    assert not verdict.correct, verdict
    assert time.perf_counter() - started < LIMITS.wall_seconds + 5
    assert not escaped.exists()
    assert os.environ["KVBENCH_SECRET"] == "hunter2"  # the grader process is unharmed
    assert grade_code(fenced("print(input())"), [CodeTest("ok\n", "ok", "stdin")], limits=LIMITS).correct

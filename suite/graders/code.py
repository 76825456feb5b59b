"""The code grader: the last fenced python block, run against every test inside the OS sandbox.

Each test runs in a fresh bubblewrap sandbox (kvbench.graders.sandbox: new namespaces, an unprivileged
user, a read-only root, a private tmpfs, no network, rlimits, the whole tree killed at the wall limit).
The program's output is hostile data: read with a cap, decoded with replacement, and a functional
problem's value arrives on a channel the program never holds. Whatever a program does, grading returns a
verdict with a reason; only a sandbox that cannot be set up stops the run (code tasks refuse to start
without it, and without --allow-code-execution).
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import re
import zlib
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from kvbench.graders.registry import Grader, GraderVerdict
from kvbench.graders.sandbox import HARNESS, Limits, Sandbox
from kvbench.graders.thinking import final_answer

GRADER_VERSION = "code-3"
_BLOCK = re.compile(r"```([^\n`]*)\n(.*?)```", re.S)
"""A fenced block: its info string (language) and its text. Every block is matched, so that fences pair
up as written, and the answer is the last one that names python or no language: a block of the program's
output or a shell line after it is not the program (code-2 took the last block of any language)."""
_PYTHON = {"", "python", "python3", "py"}
DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class CodeTest:
    input: str
    output: str
    kind: str  # "stdin" | "functional"


def extract_code(text: str) -> str | None:
    blocks = [code for language, code in _BLOCK.findall(text) if language.strip().lower() in _PYTHON]
    return blocks[-1] if blocks else None


def _same_output(got: str, expected: str) -> bool:
    got_lines = [line.strip() for line in got.strip().splitlines()]
    want_lines = [line.strip() for line in expected.strip().splitlines()]
    if got_lines == want_lines:
        return True
    try:  # else equal as numbers, token by token (1.0 and 1, 2.50 and 2.5)
        return [[Decimal(x) for x in a.split()] for a in got_lines] == [
            [Decimal(x) for x in b.split()] for b in want_lines
        ]
    except InvalidOperation:
        return False


def _run_test(
    sandbox: Sandbox, files: dict[str, str], test: CodeTest, function: str | None, limits: Limits
) -> str | None:
    """None when the test passes, else why it failed (``files``: the solution and the harness)."""
    functional = test.kind == "functional" and bool(function)
    argv, stdin = ["harness.py", "stdin", "solution.py"], test.input.encode()
    if functional:
        try:
            request = json.dumps({"args": [json.loads(line) for line in test.input.splitlines()]})
            expected = json.loads(test.output)
        except ValueError:
            return "unreadable test case"
        argv = ["harness.py", "call", "solution.py", str(function), "{result_fd}"]
        stdin = (request + "\n").encode()
    outcome = sandbox.run(files, argv, stdin, limits)
    if outcome.killed is not None:
        return outcome.killed
    if outcome.status != 0:
        return f"exit {outcome.status}"
    if not functional:
        got = outcome.stdout.decode("utf-8", errors="replace")
        return None if _same_output(got, test.output) else "wrong answer"
    try:
        value = json.loads(outcome.result.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return "malformed result"
    return None if value == expected else "wrong answer"


def grade_code(
    output: str,
    tests: list[CodeTest],
    function: str | None = None,
    *,
    thinking: bool = False,
    limits: Limits = DEFAULT_LIMITS,
    sandbox: Sandbox | None = None,
) -> GraderVerdict:
    """The verdict on the last python block; when it fails, its detail and reason say why the first
    failing test failed: ``test N: REASON`` (timeout, output limit, exit N, wrong answer, malformed
    result, unreadable test case)."""
    answer = final_answer(output, thinking=thinking)
    code = extract_code(answer) if answer is not None else None
    if code is None:
        return GraderVerdict(False, True, "no code block", GRADER_VERSION, failure="no code block")
    sandbox = sandbox or Sandbox()
    sandbox.check()  # a missing boundary stops the run, never grades a sample
    files = {"solution.py": code, "harness.py": HARNESS.read_text()}  # read once for every test
    for number, test in enumerate(tests):
        reason = _run_test(sandbox, files, test, function, limits)
        if reason is not None:
            failed = f"test {number}: {reason}"
            return GraderVerdict(False, False, failed, GRADER_VERSION, failure=failed)
    return GraderVerdict(True, False, None, GRADER_VERSION)


class CodeTaskGrader(Grader):
    """The ``code`` grader: tests from the task's ``tests`` columns (functional problems name their method
    in ``metadata``), the last python block run against each inside the sandbox."""

    def problem(self, task: Any, row: dict[str, Any], problem_id: str, question: str) -> tuple[str, dict]:
        fields = task.source.fields
        tests = [
            CodeTest(str(t["input"]), str(t["output"]), str(t.get("testtype", "stdin")))
            for column in fields.tests
            for t in decode_tests(str(row[column] or "[]"))
        ]
        metadata = json.loads(row[fields.metadata] or "{}") if fields.metadata else {}
        function = metadata.get("func_name")
        starter = str(row.get(fields.starter_code) or "") if fields.starter_code else ""
        if function:
            form = f"Complete this class and return it in one ```python block:\n```python\n{starter}\n```"
        else:
            form = (
                "Read the input from standard input and print the answer to standard output. "
                "Give the whole program in one ```python block."
            )
        prompt = task.prompt.replace("{question}", question).replace("{format}", form)
        return prompt, {"tests": tests, "function": function}

    def grade(self, output: str, gold: dict[str, Any], task: Any, *, thinking: bool) -> GraderVerdict:
        return grade_code(output, gold["tests"], gold["function"], thinking=thinking)


class _StringsOnly(pickle.Unpickler):
    """LiveCodeBench pickles its private tests as a plain string: refuse anything that needs a class."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a dataset")


def decode_tests(value: str) -> list[dict[str, Any]]:
    """Test cases as stored: a JSON list, or base64(zlib(pickle(JSON string)))."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raw = zlib.decompress(base64.b64decode(value.encode()))
        return json.loads(_StringsOnly(io.BytesIO(raw)).load())

"""The code grader: the last fenced python block, run against every test in a sandboxed subprocess.

Each test runs in a fresh process with CPU-time, address-space, file-size and open-file limits, a
wall-clock limit (the whole process group is killed), a throwaway working folder, an empty environment,
no network (a fresh network namespace via `unshare --net` where the machine allows it; sockets are
refused in any case) and an audit hook against new processes and writes outside the folder. All tests
must pass. Running model-written code is opt-in: tasks with this grader refuse to start without
--allow-code-execution.
"""

from __future__ import annotations

import json
import os
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache
from pathlib import Path

from kvbench.graders.thinking import final_answer

GRADER_VERSION = "code-1"
CHILD = Path(__file__).with_name("sandbox_child.py")
_BLOCK = re.compile(r"```(?:python|py)?[^\n]*\n(.*?)```", re.S)


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 4
    wall_seconds: float = 10.0
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20


@dataclass(frozen=True)
class CodeTest:
    input: str
    output: str
    kind: str  # "stdin" | "functional"


@dataclass(frozen=True)
class CodeVerdict:
    correct: bool
    no_answer: bool
    failed: str | None
    """Why the first failing test failed (timeout, memory, wrong answer, error)."""
    version: str = GRADER_VERSION

    @property
    def detail(self) -> str | None:
        """Why the first failing test failed (the code itself is kept in the output)."""
        return self.failed


def extract_code(text: str) -> str | None:
    blocks = _BLOCK.findall(text)
    return blocks[-1] if blocks else None


@cache
def network_namespace_available() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    try:
        return subprocess.run([unshare, "--net", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _limit(limits: Limits):
    def apply() -> None:
        os.setsid()
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_sandboxed(code: str, args: list[str], stdin: str, limits: Limits) -> tuple[str, str, int | str]:
    """(stdout, stderr, exit code or 'timeout') of the child running ``code`` in a scratch folder."""
    with tempfile.TemporaryDirectory(prefix="kvbench-sandbox-") as scratch:
        (Path(scratch) / "solution.py").write_text(code)
        command = [sys.executable, "-I", "-S", str(CHILD), *args]
        if network_namespace_available():
            command = [shutil.which("unshare"), "--net", *command]
        env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        process = subprocess.Popen(
            command,
            cwd=scratch,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_limit(limits),
        )
        try:
            out, err = process.communicate(stdin, timeout=limits.wall_seconds)
            return out, err, process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return "", "", "timeout"


def _same_output(got: str, expected: str) -> bool:
    got_lines = [line.strip() for line in got.strip().splitlines()]
    want_lines = [line.strip() for line in expected.strip().splitlines()]
    if got_lines == want_lines:
        return True
    if len(got_lines) != len(want_lines):
        return False
    for a, b in zip(got_lines, want_lines, strict=True):
        try:
            if [Decimal(x) for x in a.split()] != [Decimal(x) for x in b.split()]:
                return False
        except InvalidOperation:
            return False
    return True


def grade_code(
    output: str,
    tests: list[CodeTest],
    function: str | None = None,
    *,
    thinking: bool = False,
    limits: Limits = Limits(),
) -> CodeVerdict:
    answer = final_answer(output, thinking=thinking)
    code = extract_code(answer) if answer is not None else None
    if code is None:
        return CodeVerdict(correct=False, no_answer=True, failed="no code block")
    for number, test in enumerate(tests):
        if test.kind == "functional" and function:
            nonce = secrets.token_hex(16)
            request = json.dumps(
                {"nonce": nonce, "args": [json.loads(line) for line in test.input.splitlines()]}
            )
            out, _, status = run_sandboxed(code, ["call", "solution.py", function], request + "\n", limits)
            marker = [line[len(nonce) :] for line in out.splitlines() if line.startswith(nonce)]
            passed = status == 0 and len(marker) == 1 and json.loads(marker[0]) == json.loads(test.output)
        else:
            out, _, status = run_sandboxed(code, ["stdin", "solution.py"], test.input, limits)
            passed = status == 0 and _same_output(out, test.output)
        if not passed:
            reason = "timeout" if status == "timeout" else f"exit {status}" if status != 0 else "wrong answer"
            return CodeVerdict(correct=False, no_answer=False, failed=f"test {number}: {reason}")
    return CodeVerdict(correct=True, no_answer=False, failed=None)

"""The sandbox's cost per code test: a trivial program through the boundary against a plain subprocess.

Both arms run the same interpreter on the same program, one after the other in one process; the
boundary's arm goes through the whole grading path of one stdin test (bwrap, namespaces, the harness
and its audit hook, capped reads), the plain arm is ``python -I -S program.py`` with the same pipes.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kvbench.graders.code import CodeTest, grade_code
from kvbench.graders.sandbox import Sandbox, interpreter

PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"


@dataclass(frozen=True)
class SandboxTiming:
    arm: str
    runs: int
    median_ms: float
    p90_ms: float


def _timed(arm: str, run, repeats: int) -> SandboxTiming:
    run()  # warm the page cache and the interpreter's files
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    ordered = sorted(times)
    return SandboxTiming(arm, len(times), statistics.median(times), ordered[int(0.9 * (len(ordered) - 1))])


def time_sandbox(repeats: int = 50) -> list[SandboxTiming]:
    """Milliseconds per test: plain subprocess, then one graded stdin test inside the boundary."""
    Sandbox().check()
    with tempfile.TemporaryDirectory() as folder:
        program = Path(folder) / "program.py"
        program.write_text(PROGRAM)
        command = [str(interpreter()), "-I", "-S", str(program)]

        def plain() -> None:
            subprocess.run(command, input=b"3 4\n", capture_output=True, check=True, timeout=30)

        def graded() -> None:
            verdict = grade_code(f"```python\n{PROGRAM}```", [CodeTest("3 4\n", "7\n", "stdin")])
            assert verdict.correct, verdict

        return [
            _timed("plain subprocess", plain, repeats),
            _timed("sandbox", graded, repeats),
        ]

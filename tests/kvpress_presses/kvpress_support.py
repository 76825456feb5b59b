"""What the kvpress tests share: the kvpress venv's interpreter, or a skip that says how to get it.

(The folder is not named tests/kvpress: tests/ is on sys.path, and a folder named kvpress there would
answer ``import kvpress`` in kvbench's own venv.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kvbench.kvpress.environment import child_environment, interpreter

HERE = Path(__file__).parent


def kvpress_python() -> Path:
    """The kvpress venv's python; skip when there is none, fail where CI requires it."""
    python = interpreter()
    if python is not None and python.is_file():
        return python
    if os.environ.get("KVBENCH_REQUIRE_KVPRESS"):
        pytest.fail("KVBENCH_REQUIRE_KVPRESS is set but there is no kvpress venv: `make kvpress-venv`")
    pytest.skip("no kvpress venv (.venv-kvpress): `make kvpress-venv` builds it (CI does)")


def run_press_side(script: str, *args: object, timeout: int = 900) -> None:
    """Run a script of this folder under the kvpress venv; its stderr in the failure."""
    done = subprocess.run(
        [str(kvpress_python()), str(HERE / script), *map(str, args)],
        capture_output=True,
        text=True,
        env=child_environment(),
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]

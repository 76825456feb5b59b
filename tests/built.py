"""What several test files share and one test run makes once, under xdist as without it."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary folder of this whole test run: shared by its xdist workers (each has a folder of
    its own inside it), this session's own one without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Path]) -> Path:
    """What ``build(folder)`` returns, built once per test run into ``folder`` (``name`` in the run's
    folder): under xdist, the first worker to ask builds it while the others wait on its lock, and all
    of them then read the one result, so it must be copied before it is changed. A failed build marks
    nothing done: the next worker to ask builds it again (and fails the same way)."""
    root = run_folder(tmp_path_factory)
    folder, done = root / name, root / f"{name}.built"
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            done.write_text(str(build(folder).relative_to(folder)))
    return folder / done.read_text()

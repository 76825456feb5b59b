"""kvbench's command line run in the test's own process: ``kvbench.cli.main`` with the arguments, as the
`kvbench` script calls it, without a new interpreter (which spends about 4.5 s importing torch and
transformers before a command starts).

It answers like ``subprocess.run(..., capture_output=True, text=True)``: the exit status the script would
have, and what the command wrote to stdout and stderr. The working folder, the environment and torch's
thread count are restored afterwards. What only a new process shows stays with ``subprocess``: what a
fresh interpreter imports, plugins found at start-up, a signal's exit, the exact stderr of a failure
(libraries log there through handlers made before the capture).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import torch

from kvbench.cli import main


def kvbench(
    *args: str, cwd: Path | str | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `kvbench ARGS` here; ``env`` replaces the environment for the command, as subprocess's does."""
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, threads = dict(os.environ), os.getcwd(), torch.get_num_threads()
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                status = main(list(args))
            except SystemExit as exc:  # argparse's usage errors and --help
                status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(["kvbench", *args], status or 0, stdout.getvalue(), stderr.getvalue())

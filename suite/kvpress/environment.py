"""Where the kvpress environment's interpreter is, and the presses it has."""

from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from pathlib import Path

from kvbench.errors import SpecError

VARIABLE = "KVBENCH_KVPRESS_PYTHON"
FOLDER = ".venv-kvpress"


def checkout() -> Path:
    """The folder holding kvbench's source (an editable install's checkout), where make builds the venv."""
    import kvbench

    return Path(kvbench.__file__).resolve().parent.parent


def interpreter() -> Path | None:
    """$KVBENCH_KVPRESS_PYTHON, else .venv-kvpress/bin/python in the checkout or the current folder."""
    given = os.environ.get(VARIABLE)
    if given:
        return Path(given)
    for root in (checkout(), Path.cwd()):
        python = root / FOLDER / "bin" / "python"
        if python.is_file():
            return python
    return None


def require() -> Path:
    """The kvpress interpreter, or a SpecError saying how to build it."""
    python = interpreter()
    if python is None or not python.is_file():
        where = f"{VARIABLE}={python}" if python is not None else f"no {FOLDER}/ in {checkout()}"
        raise SpecError(
            f"kvpress presses score in kvpress's own environment, and there is none ({where}): run "
            f"`make kvpress-venv` in {checkout()} (a minute or two; see docs/kvpress.md), or point "
            f"{VARIABLE} at the python of an environment with kvpress and kvbench installed"
        )
    return python


def child_environment() -> dict[str, str]:
    """The child's variables: one torch thread per child and nothing from the network."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@cache
def installed_presses() -> tuple[str, list[str]]:
    """(kvpress version, ScorerPress class names) of the kvpress environment."""
    python = require()
    done = subprocess.run(
        [str(python), "-m", "kvbench.kvpress.child", "list"],
        capture_output=True,
        text=True,
        env=child_environment(),
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-4:])
        raise SpecError(f"{python} could not list kvpress's presses (exit {done.returncode}): {tail}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return str(found["kvpress_version"]), list(found["presses"])

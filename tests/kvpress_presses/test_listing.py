"""``kvbench list policies`` names every ScorerPress of the kvpress venv, supported or not and why."""

from __future__ import annotations

import os
import subprocess
import sys

from kvpress_support import kvpress_python

from kvbench.kvpress.environment import child_environment

# enumerated here in the kvpress venv itself, apart from kvbench's child: what kvpress exports
ENUMERATE = (
    "import inspect, kvpress as p; from kvpress.presses.scorer_press import ScorerPress as S; "
    "print('\\n'.join(sorted(n for n, c in vars(p).items() "
    "if inspect.isclass(c) and issubclass(c, S) and c is not S)))"
)


def listing(env: dict[str, str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "kvbench", "list", "policies"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line.startswith("kvpress:")]


def test_every_press_of_the_kvpress_venv_is_listed_with_its_status() -> None:
    python = kvpress_python()
    exported = subprocess.run(
        [str(python), "-c", ENUMERATE], capture_output=True, text=True, env=child_environment(), check=True
    ).stdout.split()
    assert len(exported) >= 17
    lines = {
        line.split("\t")[0].removeprefix("kvpress:"): line.split("\t")[1]
        for line in listing(dict(os.environ))
    }
    assert set(exported) <= set(lines)
    supported = sorted(name for name, what in lines.items() if what.endswith(")") and ", supported" in what)
    assert len(supported) >= 12 and "CriticalKVPress" in supported
    assert "KnormPress" in supported and "SnapKVPress" in supported
    assert "not supported: needs trained Q-filters" in lines["QFilterPress"]
    assert "not supported: needs a trained KVzap model" in lines["KVzapPress"]


def test_without_the_kvpress_venv_the_listing_says_how_to_build_it() -> None:
    env = {**os.environ, "KVBENCH_KVPRESS_PYTHON": "/nonexistent/python"}
    assert listing(env) == [
        "kvpress:*\tkvpress presses: no kvpress venv here; `make kvpress-venv` builds one (docs/kvpress.md)"
    ]

"""Isolated scorers for the tests: a scorer file, a hostile one whose score runs given code first, a short
synthetic run through one, and a fixture that stops every scorer process a test started."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from synthetic_adapter import synthetic_model

from kvbench.core.schedule import Schedule
from kvbench.isolation.host import IsolatedPolicy, IsolationLimits
from support import RecordingBackend

SLOW_IMPORT = textwrap.dedent(
    '''
    """Sleeps a minute at import: loading the file is a call like any other, under its time limit."""
    import time

    from kvbench import Policy, policy

    time.sleep(60)


    @policy("slow-import")
    class SlowImport(Policy):
        def score(self, view):
            return view.keys.float().norm(dim=-1)
    '''
)

_STARTED: list[IsolatedPolicy] = []


def started_policy(*args, **kwargs) -> IsolatedPolicy:
    """An IsolatedPolicy whose scorer process this test stops when it ends (a failed call leaves the
    process running, and the test's traceback keeps the policy alive)."""
    started = IsolatedPolicy(*args, **kwargs)
    _STARTED.append(started)
    return started


@pytest.fixture(autouse=True)
def stop_scorers():
    """Stops, after each test of a module that imports it, every scorer process it started."""
    yield
    while _STARTED:
        _STARTED.pop().close()


def scorer(tmp_path: Path, body: str, name: str = "scorer.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def hostile(
    tmp_path: Path, score_body: str, name: str = "hostile", seconds: float = 30, **limits: int
) -> IsolatedPolicy:
    """A scorer named ``name`` whose score runs ``score_body`` first, under the default limits but
    ``seconds`` per call and ``limits`` (IsolationLimits' fields)."""
    body = f'''
import os, socket, sys, time
import torch
from kvbench import Policy, policy

@policy("{name}")
class Hostile(Policy):
    target: str = ""

    def score(self, view):
{textwrap.indent(textwrap.dedent(score_body), "        ")}
        return view.keys.float().norm(dim=-1)
'''
    limited = IsolationLimits(seconds_per_call=seconds, **limits)  # type: ignore[arg-type]
    return started_policy(scorer(tmp_path, body), "Hostile", {}, limited)


def run_through(policy, steps: int = 30) -> RecordingBackend:
    model = synthetic_model(layers=2, q_heads=4, kv_heads=2, head_dim=8)
    backend = RecordingBackend(policy, Schedule(budget=16, buffer=4), model, prompt_len=3, row_seeds=[5, 9])
    for _ in range(steps):
        backend.step()
    return backend

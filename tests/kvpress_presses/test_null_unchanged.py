"""A run with a kvpress press leaves the null's and the full cache's outputs as they are without kvpress:
the same output digests as the smallest real run (tests/small_run.py, streaming as the entrant), and
kvbench's process never imports kvpress nor sees transformers' attention functions patched."""

from __future__ import annotations

import sys
from pathlib import Path

import duckdb
import pytest
from invoke import kvbench
from kvpress_support import kvpress_python
from small_run import SMALL_RUN
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from kvbench.results.check import outputs_digest


def digests(runs: Path) -> dict[str, str]:
    """Each run's output digest by its role (policy, null, reference)."""
    with duckdb.connect(str(runs / "kvbench.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT run_id, role FROM runs").fetchall()
        return {role: outputs_digest(con, run_id) for run_id, role in rows}


@pytest.mark.slow
def test_the_null_and_full_cache_are_unchanged_beside_a_kvpress_press(
    small_results: Path, tmp_path: Path
) -> None:
    kvpress_python()
    attention = dict(ALL_ATTENTION_FUNCTIONS.items())
    args = [a if a != "streaming" else "kvpress:StreamingLLMPress" for a in SMALL_RUN]
    done = kvbench(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    without, beside = digests(small_results), digests(tmp_path / "runs")
    assert set(beside) == set(without) == {"policy", "null", "reference"}
    assert beside["null"] == without["null"]
    assert beside["reference"] == without["reference"]
    assert "kvpress" not in sys.modules
    assert dict(ALL_ATTENTION_FUNCTIONS.items()) == attention

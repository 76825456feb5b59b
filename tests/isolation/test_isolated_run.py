"""`kvbench run --isolate` on the seeded tiny Qwen3: the isolated scorer produces the very outputs the
in-process one does (one run identity, one output digest), and one that hangs is stopped and named."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest
from isolated_scorers import SLOW_IMPORT

from kvbench.results.check import outputs_digest
from support import needs_sandbox

pytestmark = [pytest.mark.slow, needs_sandbox]

KVBENCH = str(Path(sys.executable).parent / "kvbench")
ARGS = ["run", "--model", "tiny-qwen3", "--task", "passkey", "--limit", "2", "--quiet", "--no-baselines"]
SCORER = textwrap.dedent(
    '''
    """Key norms with a seeded jitter: the draws must be the same in and out of process."""
    from kvbench import Policy, policy


    @policy("jittered-norm")
    class JitteredNorm(Policy):
        def score(self, view):
            return view.keys.float().norm(dim=-1) + 0.5 * view.uniform(*view.keys.shape[1:3])


    @policy("stalls")
    class Stalls(Policy):
        def score(self, view):
            import time

            time.sleep(3600)
    '''
)


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([KVBENCH, *ARGS, *args], capture_output=True, text=True, cwd=tmp_path, timeout=900)


def stored(out: Path) -> dict[str, str]:
    with duckdb.connect(str(out / "kvbench.duckdb"), read_only=True) as con:
        return {
            run_id: outputs_digest(con, run_id)
            for (run_id,) in con.execute("SELECT run_id FROM runs").fetchall()
        }


def test_isolated_and_in_process_runs_store_the_same_outputs(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(SCORER)
    for out, extra in (("inside", []), ("apart", ["--isolate"])):
        done = run(tmp_path, "--policy", "mine.py:JitteredNorm", "--out", out, *extra)
        assert done.returncode == 0, done.stderr
    inside, apart = stored(tmp_path / "inside"), stored(tmp_path / "apart")
    assert len(inside) == 1 and inside == apart


def test_a_stalled_isolated_scorer_is_stopped_with_its_place_named(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(SCORER)
    started = time.monotonic()
    done = run(tmp_path, "--policy", "mine.py:Stalls", "--isolate", "--scorer-seconds", "2")
    assert done.returncode != 0
    assert time.monotonic() - started < 300
    assert (
        "policy 'stalls' at layer 0, eviction event 0: no answer within 2 s, the time limit per event"
        in done.stderr
    )


def test_a_scorer_whose_import_stalls_is_stopped_at_scorer_seconds(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text(SLOW_IMPORT)
    started = time.monotonic()
    done = run(tmp_path, "--policy", "slow.py:SlowImport", "--isolate", "--scorer-seconds", "2")
    assert done.returncode != 0
    assert time.monotonic() - started < 55  # it did not wait for the import
    assert "scorer slow.py:SlowImport: no answer within 2 s, the time limit per call (--scorer-seconds" in (
        done.stderr
    ), done.stderr


def test_bench_evict_times_an_isolated_scorer_beside_in_process_and_exits_cleanly(tmp_path: Path) -> None:
    """The isolated arm's tensors (its replies, kept in the layer state to the end) leave the interpreter
    cleanly: the command exits 0 (tensors freed on a thread Python was finalizing once aborted it)."""
    (tmp_path / "mine.py").write_text(SCORER)
    out = tmp_path / "bench.json"
    shape = ["--batch", "1", "--budget", "256", "--buffer", "32", "--min-time", "0.05", "--keys", "random"]
    done = subprocess.run(
        [KVBENCH, "bench", "evict", "--isolated", "mine.py:JitteredNorm", *shape, "--json", str(out)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0 and "terminate" not in done.stderr, done.stderr
    rows = {r["policy"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"random", "jittered-norm (in process)", "jittered-norm (isolated)"}
    assert all(r["ms_per_event"] > 0 for r in rows.values())

"""kvbench run end to end: real model, real shards, real DuckDB; interrupted and concurrent runs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from invoke import kvbench

KVBENCH = str(Path(sys.executable).parent / "kvbench")
TINY = ["--model", "tiny-qwen3", "--quiet"]


def sample_keys(out: Path) -> list[tuple]:
    con = duckdb.connect(str(out / "kvbench.duckdb"), read_only=True)
    try:
        return con.execute("SELECT run_id, problem_id, sample FROM samples ORDER BY ALL").fetchall()
    finally:
        con.close()


def shard_rows(out: Path) -> list[tuple]:
    con = duckdb.connect()
    rows = con.execute(
        f"SELECT run_id, problem_id, sample FROM read_parquet('{out}/shards/*/*.parquet') ORDER BY ALL"
    ).fetchall()
    con.close()
    return rows


def test_run_writes_runs_and_samples_tables(tmp_path: Path) -> None:
    both = ["--task", "passkey", "--task", "fidelity"]
    result = kvbench(
        "run", *TINY, *both, "--policy", "snapkv", "--limit", "2", "--samples", "2", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "passkey on tiny-qwen3" in result.stdout and "random (null)" in result.stdout
    assert "results: runs/kvbench.duckdb (tables runs, samples)" in result.stdout
    con = duckdb.connect(str(tmp_path / "runs" / "kvbench.duckdb"), read_only=True)
    runs = con.execute("SELECT task, policy, role, budget FROM runs ORDER BY ALL").fetchall()
    expected = [
        # the fidelity probe's full cache carries its K: its scores start at the first eviction event
        (t, p, r, None if (r, t) == ("reference", "passkey") else 256)
        for t in ("fidelity", "passkey")
        for p, r in (("full", "reference"), ("random", "null"), ("snapkv", "policy"))
    ]
    assert runs == sorted(expected, key=lambda row: (row[0], row[1], row[2]))
    count, seeds, evictions, forced = con.execute(
        "SELECT count(*), count(DISTINCT s.seed), min(s.evictions),"
        " bool_and(s.finish_reason = 'teacher-forced')"
        " FROM samples s JOIN runs r USING (run_id) WHERE r.role = 'policy'"
    ).fetchone()
    assert (count, seeds, forced) == (2 * 2 * 2, 8, True)  # tasks × problems × samples, a seed each
    assert evictions >= 10  # (1024 + prompt − 256) / 64 events in every trace
    con.close()
    again = kvbench("run", *TINY, *both, "--policy", "snapkv", "--limit", "2", "--samples", "2", cwd=tmp_path)
    assert "0 problems computed, 12 reused" in again.stdout
    assert len(sample_keys(tmp_path / "runs")) == 6 * 2 * 2


POLICIES = ("snapkv", "h2o")
RESUMED = ["run", *TINY, *(f"--policy={p}" for p in POLICIES), "--limit", "8", "--samples", "2"]
ARMS = len(POLICIES) + 2


def measured_rows(out: Path) -> list[tuple]:
    """Every stored sample's values, timings left out: what a resumed run must reproduce exactly."""
    con = duckdb.connect(str(out / "kvbench.duckdb"), read_only=True)
    try:
        rows = con.execute(
            "SELECT run_id, problem_id, sample, seed, metric, correct, strict_correct, finish_reason, "
            "generated_tokens, evictions, output, no_answer, grader_version, answer_logprob, kl_to_full, "
            "secondary FROM samples ORDER BY ALL"
        ).fetchall()
    finally:
        con.close()
    untimed = []
    for *head, secondary in rows:
        values = {k: v for k, v in json.loads(secondary).items() if not k.endswith("seconds")}
        untimed.append((*head, json.dumps(values, sort_keys=True)))
    return untimed


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[tuple]:
    root = tmp_path_factory.mktemp("uninterrupted")
    assert kvbench(*RESUMED, cwd=root).returncode == 0
    return measured_rows(root / "runs")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_run_resumes_without_loss_or_duplicates(
    tmp_path: Path, stop: signal.Signals, uninterrupted: list[tuple]
) -> None:
    args = RESUMED
    process = subprocess.Popen(
        [KVBENCH, *args],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # an ignored or blocked SIGINT is inherited across exec: whatever an earlier test (or a library it
        # used) did to this process's SIGINT, the run gets it as it would under a user's shell
        preexec_fn=_default_sigint,
    )
    shards = tmp_path / "runs" / "shards"
    deadline = time.time() + 300
    while time.time() < deadline and len(list(shards.glob("*/*.parquet"))) < 3:
        time.sleep(0.05)
    process.send_signal(stop)
    process.wait(timeout=60)
    assert process.returncode != 0
    written = len(list(shards.glob("*/*.parquet")))
    problems = 8  # the quick suite's fidelity probe at --limit 8
    assert 3 <= written < problems * ARMS  # stopped midway
    assert not list(shards.glob("*/.*"))  # no half-written file is left visible
    result = kvbench(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = shard_rows(tmp_path / "runs")
    expected = problems * ARMS * 2  # problems × (policies, null, full) × samples
    assert len(rows) == len(set(rows)) == expected
    assert sample_keys(tmp_path / "runs") == rows
    # and every value equals an uninterrupted run's: metrics, seeds, texts, measurements
    assert measured_rows(tmp_path / "runs") == uninterrupted


@pytest.mark.slow
def test_two_runs_writing_the_same_folder_at_once_both_land(tmp_path: Path) -> None:
    common = ["run", *TINY, "--limit", "6", "--task", "passkey"]
    first = subprocess.Popen(
        [KVBENCH, *common, "--policy", "snapkv"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    second = subprocess.Popen(
        [KVBENCH, *common, "--policy", "h2o"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for process in (first, second):
        _, err = process.communicate(timeout=900)
        assert process.returncode == 0, err
    rows = sample_keys(tmp_path / "runs")
    assert len(rows) == len(set(rows)) == 4 * 6  # snapkv, h2o, and the shared null and full
    assert rows == shard_rows(tmp_path / "runs")


def test_a_budget_that_cannot_protect_the_prompt_writes_nothing(tmp_path: Path) -> None:
    result = kvbench("run", *TINY, "--policy", "snapkv", "--budget", "80", "--limit", "1", cwd=tmp_path)
    assert result.returncode == 2
    assert "leaves room to protect 15 prompt tokens, but task 'fidelity' has prompts of" in result.stderr
    assert not (tmp_path / "runs" / "shards").exists() or not list((tmp_path / "runs").rglob("*.parquet"))


def test_a_protocol_that_protects_sinks_is_not_refused_for_the_length_of_its_prompts(tmp_path: Path) -> None:
    """sink-only protects 4 tokens, not the prompt: K = 66 (room for one) caps the sinks, as decoding
    does, and says nothing of the prompt's length."""
    args = ("--protocol", "sink-only", "--budget", "66", "--limit", "1", "--no-baselines")
    result = kvbench("run", *TINY, "--policy", "snapkv", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "prompt" not in result.stderr

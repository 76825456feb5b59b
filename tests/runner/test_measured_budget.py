"""K = N_avg / ratio with N_avg measured on the full-cache arm: planned, settled, stored and reused."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import duckdb
import pytest
from invoke import kvbench

from kvbench.runner.budgets import settle
from kvbench.runner.identity import measurement_key
from kvbench.runner.plan import RunRequest, plan
from kvbench.specs.resolved import MeasurementRecord

GSM8K = Path(__file__).parents[1] / "fixtures" / "hub" / "openai" / "gsm8k"
# tiny-qwen3's byte-level prompts are longer than a quarter of a few hundred tokens: the test protocol
# protects only the sinks, with an 8-token buffer so that K follows the measurement closely
PROTOCOL = (Path(__file__).parents[2] / "suite" / "protocols" / "sink-only.yaml").read_text()


def _request(**fields) -> RunRequest:
    return RunRequest(models=("tiny-qwen3",), policies=("snapkv",), **fields)


def test_generation_budgets_wait_for_the_full_arm_and_probes_do_not() -> None:
    cells = plan(_request(tasks=("gsm8k", "passkey")))
    by = {(c.task.name, c.role): c for c in cells}
    full = by["gsm8k", "reference"]
    for role in ("policy", "null"):
        pending = by["gsm8k", role].pending
        assert pending is not None and pending.reference_run == full.run_id
        assert pending.key == measurement_key(full)
        assert by["passkey", role].pending is None and by["passkey", role].budget == 256  # 1024 / 4
    assert full.pending is None
    # the measurement outlives a larger --limit or more samples, never a change of what is generated
    for changed in (_request(tasks=("gsm8k",), limit=7), _request(tasks=("gsm8k",), samples=3)):
        (other,) = [c for c in plan(changed) if c.role == "reference"]
        assert other.run_id != full.run_id and measurement_key(other) == measurement_key(full)
    (capped,) = [c for c in plan(_request(tasks=("gsm8k",), max_new_tokens=99)) if c.role == "reference"]
    assert measurement_key(capped) != measurement_key(full)
    fixed = [c for c in plan(_request(tasks=("gsm8k",), budget=384)) if c.role != "reference"]
    assert all(c.pending is None and c.budget == 384 for c in fixed)


def test_settling_sets_k_from_the_measurement_and_records_it() -> None:
    cells = plan(_request(tasks=("gsm8k",)))
    policy = next(c for c in cells if c.role == "policy")
    full = next(c for c in cells if c.role == "reference")

    def measured(mean: float, problems: int = 3, samples: int = 6) -> MeasurementRecord:
        return MeasurementRecord(
            measured=mean, declared=2048.0, reference_run=full.run_id, problems=problems, samples=samples
        )

    settled = settle(policy, measured(1000.0))
    assert settled.pending is None and settled.budget == 256  # 1000 / 4 = 250 -> the nearest multiple of 64
    assert settle(policy, measured(1500.0)).budget == 384  # 375 -> 384
    assert settled.n_avg == 1000.0 and settled.spec.record()["budget"] == 256
    assert settled.spec.record()["n_avg_measurement"] == {
        "measured": 1000.0,
        "declared": 2048.0,
        "reference_run": full.run_id,
        "problems": 3,
        "samples": 6,
    }
    assert settled.run_id != policy.run_id
    again = settle(policy, measured(1000.0, 4, 8))
    assert again.budget == 256 and again.run_id != settled.run_id  # the identity says what was measured


def test_without_the_full_arm_or_a_stored_measurement_nothing_runs(tmp_path: Path) -> None:
    args = ["--model", "tiny-qwen3", "--task", "gsm8k", "--data", str(GSM8K), "--policy", "snapkv"]
    run = kvbench("run", *args, "--no-baselines", "--quiet", cwd=tmp_path)
    assert run.returncode != 0
    assert "follows the full cache's measured N_avg on tiny-qwen3/gsm8k" in run.stderr
    assert "drop --no-baselines" in run.stderr and "--budget" in run.stderr
    assert not (tmp_path / "runs" / "shards").exists()


def _run(tmp_path: Path, limit: int) -> subprocess.CompletedProcess:
    (tmp_path / "b8.yaml").write_text(
        PROTOCOL.replace("name: sink-only", "name: b8").replace("buffer: 64", "buffer: 8")
    )
    args = ["--model", "tiny-qwen3", "--task", "gsm8k", "--data", str(GSM8K), "--protocol", "b8.yaml"]
    args += ["--policy", "snapkv", "--max-new-tokens", "400", "--samples", "4", "--limit", str(limit)]
    run = kvbench("run", *args, "--quiet", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    return run


def _runs(tmp_path: Path) -> dict[tuple[str, int], tuple]:
    """(policy, problems) -> (run id, K, N_avg, declared, measured on, mean generated length)."""
    con = duckdb.connect(str(tmp_path / "runs" / "kvbench.duckdb"), read_only=True)
    try:
        rows = con.execute(
            "SELECT r.policy, count(DISTINCT s.problem_id), r.run_id, r.budget, r.n_avg, r.n_avg_declared, "
            "r.n_avg_measured_on, avg(s.generated_tokens) FROM runs r JOIN samples s USING (run_id) "
            "GROUP BY ALL"
        ).fetchall()
    finally:
        con.close()
    return {(r[0], r[1]): r[2:] for r in rows}


@pytest.mark.slow
def test_k_follows_the_full_arms_lengths_and_stays_when_the_run_resumes_or_grows(tmp_path: Path) -> None:
    first = _run(tmp_path, limit=1)
    runs = _runs(tmp_path)
    full_id, _, _, _, _, lengths = runs["full", 1]
    k = max(round(lengths / 4 / 8) * 8, 16)
    assert k != 2048 // 4  # what the task's declared n_avg would have given
    for policy in ("snapkv", "random"):
        _, budget, n_avg, declared, measured_on, _ = runs[policy, 1]
        assert (budget, n_avg, declared, measured_on) == (k, pytest.approx(lengths), 2048.0, full_id)
    table = next(line for line in first.stdout.splitlines() if line.startswith("│ snapkv"))
    assert f"(pass@1; K = {k}; " in first.stdout and f"│    {k / lengths:.2f} │" in table
    assert f"N_avg = {lengths:.1f} tokens" in first.stdout
    (stored,) = (tmp_path / "runs" / "budgets").glob("*.json")
    assert json.loads(stored.read_text())["n_avg"] == pytest.approx(lengths)

    resumed = _run(tmp_path, limit=1)
    assert "0 problems computed, 3 reused" in resumed.stdout
    assert _runs(tmp_path) == runs

    _run(tmp_path, limit=2)  # extended: every arm is a new run over two problems, K is the first one's
    grown = _runs(tmp_path)
    assert grown["full", 2][0] != full_id
    for policy in ("snapkv", "random"):
        _, budget, n_avg, _, measured_on, _ = grown[policy, 2]
        assert (budget, n_avg, measured_on) == (k, pytest.approx(lengths), full_id)
    assert list((tmp_path / "runs" / "budgets").glob("*.json")) == [stored]

"""The kvbench command, run as a user runs it: the installed console script in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic_adapter import SyntheticBackend, synthetic_model

from kvbench.core.schedule import Schedule
from kvbench.registry import known_policies, make_policy

KVBENCH = str(Path(sys.executable).parent / "kvbench")


def kvbench(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([KVBENCH, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_list_policies_one_per_line_with_a_description() -> None:
    result = kvbench("list", "policies")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == list(known_policies())
    assert all(len(line.split("\t")[1]) > 10 for line in lines)


def test_new_policy_writes_a_working_template_and_never_overwrites(tmp_path: Path) -> None:
    result = kvbench("new-policy", "my-scorer", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    path = tmp_path / "my_scorer.py"
    assert path.is_file() and f"--policy {path}:MyScorer" in result.stdout
    policy = make_policy(f"{path}:MyScorer")
    backend = SyntheticBackend(
        policy, Schedule(budget=32, buffer=8), synthetic_model(), prompt_len=4, row_seeds=[0]
    )
    for _ in range(60):
        backend.step()
    assert backend.evictor.stats.events >= 3

    again = kvbench("new-policy", "my-scorer", "--dir", str(tmp_path))
    assert again.returncode == 2 and "exists already" in again.stderr
    taken = kvbench("new-policy", "snapkv", "--dir", str(tmp_path))
    assert taken.returncode == 2 and "exists already" in taken.stderr
    bad = kvbench("new-policy", "My Scorer!", "--dir", str(tmp_path))
    assert bad.returncode == 2 and "lower-case" in bad.stderr


def test_bench_evict_reports_ratios_to_random(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = kvbench(
        "bench",
        "evict",
        "--policy",
        "snapkv",
        "--policy",
        "streaming",
        "--batch",
        "1",
        "--budget",
        "256",
        "--buffer",
        "32",
        "--min-time",
        "0.01",
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    rows = {r["policy"]: r for r in report["results"]}
    assert set(rows) == {"random", "snapkv", "streaming"}
    assert rows["random"]["ratio_to_random"] == 1.0
    assert all(r["ms_per_event"] > 0 for r in rows.values())
    assert report["machine"]["cpu_count"] >= 1 and "× random" in result.stdout


@pytest.mark.parametrize("args", [["list", "widgets"], ["nonsense"]])
def test_bad_arguments_exit_non_zero_with_usage(args: list[str]) -> None:
    result = kvbench(*args)
    assert result.returncode == 2 and "usage:" in result.stderr


def test_python_dash_m_kvbench() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvbench", "list", "policies"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "random\t" in result.stdout

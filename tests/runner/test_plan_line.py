"""What `kvbench run` says before its first token: the units it will compute and, once this machine has
run the model before, how long they will take; a --limit beyond what a task holds is said, or refused
before anything loads where it would make a probe generate without bound."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from invoke import kvbench

GSM8K = Path(__file__).parents[1] / "fixtures" / "hub" / "openai" / "gsm8k"


def test_the_plan_line_gives_the_time_once_this_machine_has_paces(tmp_path: Path) -> None:
    args = ("run", "--model", "tiny-qwen3", "--task", "gsm8k", "--data", str(GSM8K), "--budget", "384")
    args += ("--max-new-tokens", "8", "--samples", "1", "--no-baselines", "--limit", "50", "--quiet")
    own_paces = {**os.environ, "KVBENCH_CACHE": str(tmp_path / "cache")}  # no other test's paces
    first = kvbench(*args, "--policy", "snapkv", cwd=tmp_path, env=own_paces)
    assert first.returncode == 0, first.stderr
    said = re.search(r"task gsm8k holds (\d+) problems: a limit of 50 runs them all", first.stdout)
    assert said, first.stdout
    problems = int(said.group(1))
    assert 0 < problems < 50
    assert (
        f"plan: {problems} unit(s) of tiny-qwen3 to compute (0 stored); no earlier run of tiny-qwen3 on this "
        "machine to time them by" in first.stdout
    ), first.stdout
    second = kvbench(
        *args, "--policy", "h2o", cwd=tmp_path, env=own_paces
    )  # another policy: nothing stored, paces known
    assert second.returncode == 0, second.stderr
    line = re.search(
        rf"plan: {problems} unit\(s\) of tiny-qwen3 to compute \(0 stored\): about (\d+):(\d\d):(\d\d)",
        second.stdout,
    )
    assert line, second.stdout
    assert "on this machine, by earlier runs' paces here" in second.stdout


def test_a_limit_that_would_make_a_probe_generate_without_bound_is_refused_at_once(tmp_path: Path) -> None:
    started = time.monotonic()
    done = kvbench("run", "--model", "tiny-qwen3", "--task", "fidelity", "--limit", "100000", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert (
        "--limit 100000: task 'fidelity' is a probe of 4 problems; a larger --limit makes more (each seeded "
        "by its index), up to 1000: give a --limit of at most 1000" in done.stderr
    )
    assert time.monotonic() - started < 60 and not (tmp_path / "runs" / "shards").exists()

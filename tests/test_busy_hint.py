"""On a busy machine `kvbench run` and `kvbench generate` suggest --threads, once, before they compute;
not when --threads is given, not off the CPU. The load is a parameter here, not read from this machine."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kvbench.commands.common import busy_machine_hint

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_busy_machine_is_told_the_thread_count_and_where_it_is_explained(two_threads: None) -> None:
    assert busy_machine_hint(None, "cpu", load=4.2, cores=2) == (
        "the machine is busy (load 4.2 on 2 cores): `--threads 1` can be several times faster here "
        "(docs/running.md#on-a-busy-machine)"
    )
    # one other process on one core is enough to slow two threads 2.8 times (docs/running.md)
    assert busy_machine_hint(None, "cpu", load=1.0, cores=2) is not None
    assert busy_machine_hint(None, "cpu", load=0.9, cores=2) is None
    # on 8 cores, two threads leave 6 free: a load of 6.5 does not reach them, 7 does
    assert busy_machine_hint(None, "cpu", load=6.5, cores=8) is None
    assert "`--threads 1`" in (busy_machine_hint(None, "cpu", load=7.0, cores=8) or "")


def test_a_large_machine_is_told_to_leave_the_busy_cores_alone() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(64)
    try:
        hint = busy_machine_hint(None, "cpu", load=1.3, cores=64)
    finally:
        torch.set_num_threads(before)
    assert hint is not None and "(load 1.3 on 64 cores): `--threads 62`" in hint


def test_no_hint_where_threads_are_chosen_or_the_work_is_not_on_the_cpu(two_threads: None) -> None:
    assert busy_machine_hint(1, "cpu", load=9.0, cores=2) is None
    assert busy_machine_hint(2, "cpu", load=9.0, cores=2) is None
    assert busy_machine_hint(None, "cuda", load=9.0, cores=2) is None
    assert busy_machine_hint(None, "cuda:1", load=9.0, cores=2) is None


def test_the_page_the_hint_names_has_that_section() -> None:
    headings = re.findall(r"^## (.+)$", (ROOT / "docs" / "running.md").read_text(), flags=re.M)
    assert "on-a-busy-machine" in {h.lower().replace(" ", "-") for h in headings}


def test_a_run_states_the_spin_the_load_at_start_chose_and_records_it(tmp_path: Path) -> None:
    """The spin is chosen before torch loads (libgomp reads it once), stated before the run computes and
    recorded with it; a user's own setting is kept and named as theirs."""
    import json
    import os
    import subprocess
    import sys

    def kvbench(
        *given: str, env: dict
    ) -> subprocess.CompletedProcess:  # a process of its own: torch not loaded
        command = [str(Path(sys.executable).parent / "kvbench"), *given]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)

    args = ("run", "--model", "tiny-qwen3", "--task", "passkey", "--limit", "1", "--samples", "1")
    args += ("--policy", "snapkv", "--no-baselines", "--quiet")
    environment = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    done = kvbench(*args, env=environment)
    assert done.returncode == 0, done.stderr
    said = re.search(
        r"torch: \d+ thread\(s\); (busy|quiet) at start \(load [\d.]+ on \d+ cores\)", done.stdout
    )
    assert said, done.stdout
    (manifest,) = (tmp_path / "runs" / "shards").glob("*/manifest.json")
    spin = json.loads(manifest.read_text())["hardware"]["omp_spin"]
    # what the line says is what the run had: the short spin where the machine was busy at start
    assert spin == ("1000" if said.group(1) == "busy" else "30000"), (said.group(0), spin)
    own = kvbench(*args, "--out", "mine", env={**environment, "GOMP_SPINCOUNT": "7"})
    assert own.returncode == 0 and "GOMP_SPINCOUNT=7 (yours)" in own.stdout, own.stdout


def test_the_short_spin_is_for_a_machine_busy_at_start() -> None:
    from kvbench.commands.common import QUIET_SPIN, SHORT_SPIN, spin_for

    # quiet: a tenth of libgomp's spin, as fast there and faster should the machine get busy mid-run
    assert spin_for(0.0) == spin_for(0.99) == QUIET_SPIN == "30000"
    assert spin_for(1.0) == spin_for(4.2) == SHORT_SPIN == "1000"

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

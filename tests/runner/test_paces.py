"""The paces kept between runs (kvbench.runner.paces): written per machine and model, read back as each
kind's mean unit, the newest KEPT_UNITS only; a damaged or unwritable file costs the estimate, never the
run."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.cache_folder import CACHE_ENV
from kvbench.runner import paces


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_paces_read_back_as_each_kinds_mean_unit_per_machine_and_model() -> None:
    paces.record("cpu A", "smollm2-135m", [("passkey", True, 10.0, 100.0), ("passkey", True, 30.0, 300.0)])
    paces.record("cpu A", "smollm2-135m", [("fidelity", False, 4.0, 512.0)])
    assert paces.stored("cpu A", "smollm2-135m") == {
        ("passkey", True): (20.0, 200.0),
        ("fidelity", False): (4.0, 512.0),
    }
    assert paces.stored("cpu B", "smollm2-135m") == {}  # another machine has none of them
    assert paces.stored("cpu A", "tiny-qwen3") == {}


def test_only_the_newest_units_are_kept() -> None:
    old = [("passkey", True, 1000.0, 1.0)] * 5
    new = [("passkey", True, 2.0, 1.0)] * paces.KEPT_UNITS
    paces.record("cpu", "m", old)
    paces.record("cpu", "m", new)
    assert paces.stored("cpu", "m") == {("passkey", True): (2.0, 1.0)}


def test_a_damaged_or_unwritable_file_costs_the_estimate_only(own_cache: Path) -> None:
    own_cache.mkdir()
    (own_cache / "paces.json").write_text("{not json")
    assert paces.stored("cpu", "m") == {}
    paces.record("cpu", "m", [("passkey", True, 2.0, 1.0)])  # replaces the damaged file
    assert paces.stored("cpu", "m") == {("passkey", True): (2.0, 1.0)}
    for path in own_cache.iterdir():
        path.unlink()
    own_cache.rmdir()
    own_cache.write_text("a file where the cache folder should be")  # no file can be written under it
    paces.record("cpu", "m", [("passkey", True, 2.0, 1.0)])  # no error: the run goes on
    assert paces.stored("cpu", "m") == {}


def test_a_run_on_a_busy_machine_does_not_set_the_pace() -> None:
    """Five units at 0.1 s a token and two, made while the machine was busy, at 1 s a token: the median
    pace is the quiet one (the mean would be 0.36 s a token)."""
    quiet = [("fidelity", True, 100.0, 1000.0)] * 5
    busy = [("fidelity", True, 1000.0, 1000.0)] * 2
    paces.record("cpu", "m", quiet + busy)
    assert paces.stored("cpu", "m") == {("fidelity", True): (100.0, 1000.0)}

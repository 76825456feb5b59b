"""`kvbench bench decode|serve --out`: one JSON record per benchmark under OUT/bench/, then ingested."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import pytest

from kvbench.bench.decode import DecodeTiming
from kvbench.commands.bench import _record


def test_two_benchmarks_recorded_in_the_same_second_keep_both_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes finishing in one second (two GPUs, one results folder) must not overwrite each
    other's record: the file name once carried only the model and a timestamp to the second."""
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.25)
    settings = {"model": "tiny-qwen3", "tokens": 64, "budget": 32, "buffer": 8, "batch": 1, "device": "cpu"}
    rows = [DecodeTiming("full", 64, 100.0, 0, 0.0, 0.0, 1024, 1.0, 1.0)]
    first = _record(tmp_path, settings, {"cpu": "test CPU"}, rows)
    second = _record(tmp_path, settings | {"budget": 16}, {"cpu": "test CPU"}, rows)
    assert first != second and first.is_file() and second.is_file()
    with duckdb.connect(str(tmp_path / "kvbench.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(DISTINCT file) FROM bench").fetchall() == [(2,)]

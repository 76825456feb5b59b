"""The store's one atomic write: a reader sees the old file or the new one, never a part, and a failed or
losing write leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.store.atomic import atomic_write


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "deeper" / "manifest.json"  # the folder is made
    assert atomic_write(path, lambda temp: temp.write_text("first"))
    assert atomic_write(path, lambda temp: temp.write_text("second"))
    assert path.read_text() == "second"
    assert [p.name for p in path.parent.iterdir()] == ["manifest.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path: Path) -> None:
    path = tmp_path / "shard.parquet"
    path.write_text("stored")

    def half(temp: Path) -> None:
        temp.write_text("half a shard")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, half)
    assert path.read_text() == "stored"
    assert [p.name for p in tmp_path.iterdir()] == ["shard.parquet"]


def test_write_once_keeps_the_first_writers_file(tmp_path: Path) -> None:
    path = tmp_path / "n_avg.json"
    assert atomic_write(path, lambda temp: temp.write_text("measured first"), once=True)
    assert not atomic_write(path, lambda temp: temp.write_text("measured second"), once=True)
    assert path.read_text() == "measured first"
    assert [p.name for p in tmp_path.iterdir()] == ["n_avg.json"]

"""An empty (0-byte) or truncated snapshot, as a full disk or a killed copy leaves one: the page names the
file and how to rebuild it (a public page says only that it cannot be read), and `kvbench leaderboard`
refuses to serve it before a server starts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from boardtest import open_app

KVBENCH = str(Path(sys.executable).parent / "kvbench")


@pytest.fixture
def empty_snapshot(tmp_path: Path) -> Path:
    (tmp_path / "runs" / "shards").mkdir(parents=True)
    snapshot = tmp_path / "runs" / "kvbench.snapshot.duckdb"
    snapshot.write_bytes(b"")
    return snapshot


def test_the_page_names_an_empty_snapshot_and_its_rebuild(empty_snapshot: Path, monkeypatch) -> None:
    app = open_app(empty_snapshot, monkeypatch)  # no exception: the page says what happened
    (error,) = app.error
    assert error.value.startswith(f"{empty_snapshot} cannot be read: it is damaged")
    assert f"`kvbench ingest --rebuild --out {empty_snapshot.parent}`" in error.value
    public = open_app(empty_snapshot, monkeypatch, public=True)
    (error,) = public.error
    assert str(empty_snapshot.parent) not in error.value and "cannot be read" in error.value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_kvbench_leaderboard_refuses_an_empty_snapshot_before_serving(empty_snapshot: Path) -> None:
    # its own session, so that a server it might start goes with it
    process = subprocess.Popen(
        [KVBENCH, "leaderboard", "--db", str(empty_snapshot), "--port", str(_free_port())],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 2
    assert f"kvbench: {empty_snapshot} cannot be read: it is damaged" in err, err
    assert f"`kvbench ingest --rebuild --out {empty_snapshot.parent}`" in err and "Traceback" not in err

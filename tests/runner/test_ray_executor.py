"""`kvbench run --executor ray` on a local Ray cluster that the test starts (CPU, two replicas)."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

pytest.importorskip("ray", reason="the Ray executor's tests need kvbench[ray]")
pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
RUN = ["run", "--model", "tiny-qwen3", "--task", "passkey", "--limit", "2", "--samples", "3"]
RUN += ["--policy", "snapkv", "--quiet"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
"""The local run's torch threads, equal to each replica's (--ray-cpus-per-worker 1): CPU numbers depend
on the thread count, not on the process or node that computes them."""
TOKEN = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
"""The cluster runs with token authentication, as a shared cluster should; its token is the test's own,
given to the head and to every driver (not a ~/.ray/auth_token left on the machine, which a new machine
lacks: `ray start` then runs without authentication and a driver asking for it is refused)."""


def _free_port() -> int:
    """A port nothing listens on now (the head's GCS takes it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """A Ray head with 2 CPUs on this machine, as `ray start --head` makes one on a cluster's first node;
    its address is the one `ray start` prints for other nodes and drivers."""
    start = [str(BIN / "ray"), "start", "--head", "--num-cpus", "2", "--port", str(_free_port())]
    start += ["--include-dashboard", "false", "--disable-usage-stats"]
    done = subprocess.run(start, capture_output=True, text=True, timeout=180, env=os.environ | TOKEN)
    assert done.returncode == 0, done.stdout + done.stderr
    (address,) = re.findall(r"ray start --address='([^']+)'", done.stdout + done.stderr)
    try:
        yield address
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], capture_output=True, timeout=180)


def kvbench(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "kvbench"), *args], capture_output=True, text=True, cwd=cwd, timeout=900, env=env
    )


def stored(out: Path) -> dict[str, object]:
    """Every run's output digest (what `kvbench check` compares) and every stored sample's key."""
    from kvbench.results.check import outputs_digest

    con = duckdb.connect(str(out / "kvbench.duckdb"), read_only=True)
    try:
        runs = [r for (r,) in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
        keys = con.execute("SELECT run_id, problem_id, sample FROM samples ORDER BY ALL").fetchall()
        return {"digests": {r: outputs_digest(con, r) for r in runs}, "keys": keys}
    finally:
        con.close()


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    where = tmp_path_factory.mktemp("local")
    done = kvbench(*RUN, "--out", "out", cwd=where, env=os.environ | ONE_THREAD)
    assert done.returncode == 0, done.stderr[-3000:]
    return stored(where / "out")


def test_ray_lands_the_local_executors_rows(cluster: str, local: dict, tmp_path: Path) -> None:
    ray_args = ["--executor", "ray", "--address", cluster, "--ray-cpus-per-worker", "1"]
    done = kvbench(*RUN, *ray_args, "--out", "out", cwd=tmp_path, env=os.environ | TOKEN)
    assert done.returncode == 0, done.stderr[-3000:]
    landed = stored(tmp_path / "out")
    assert len(landed["keys"]) == 3 * 2 * 3  # arms × problems × samples
    assert landed == local  # the same samples, digest for digest
    manifest = json.loads(next((tmp_path / "out" / "shards").glob("*/manifest.json")).read_text())
    assert manifest["executor"]["kind"] == "ray" and manifest["executor"]["replicas"] == 2
    assert manifest["executor"]["torch_threads"] == [1]

    again = kvbench(*RUN, *ray_args, "--out", "out", cwd=tmp_path, env=os.environ | TOKEN)
    assert again.returncode == 0 and "0 problems computed, 6 reused" in again.stdout


def test_driver_written_results_need_no_shared_folder(cluster: str, local: dict, tmp_path: Path) -> None:
    ray_args = ["--executor", "ray", "--address", cluster, "--ray-cpus-per-worker", "1"]
    ray_args += ["--ray-results", "driver"]
    done = kvbench(*RUN, *ray_args, "--out", "out", cwd=tmp_path, env=os.environ | TOKEN)
    assert done.returncode == 0, done.stderr[-3000:]
    assert stored(tmp_path / "out") == local
    manifest = json.loads(next((tmp_path / "out" / "shards").glob("*/manifest.json")).read_text())
    assert manifest["executor"]["results"] == "driver"


def _unit_in_progress() -> int | None:
    """The pid of a replica that is scoring a unit right now (Ray titles it after the running method)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if title.startswith(b"ray::UnitWorker.run"):
            return int(entry.name)
    return None


def test_a_replica_killed_mid_unit_is_retried_without_loss_or_duplicate(
    cluster: str, local: dict, tmp_path: Path
) -> None:
    args = [*RUN, "--executor", "ray", "--address", cluster, "--ray-cpus-per-worker", "1", "--out", "out"]
    running = subprocess.Popen(
        [str(BIN / "kvbench"), *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | TOKEN,
    )
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and running.poll() is None and time.monotonic() < deadline:
        killed = _unit_in_progress()
        if killed is None:
            time.sleep(0.05)
    assert killed is not None, "no replica was seen scoring a unit"
    os.kill(killed, signal.SIGKILL)
    stdout, stderr = running.communicate(timeout=900)
    assert running.returncode == 0, stderr[-3000:]
    landed = stored(tmp_path / "out")
    assert landed["keys"] == local["keys"]  # none missing, none twice
    assert landed["digests"] == local["digests"]
    assert "6 problems computed" in stdout

"""What a user sees when the store cannot write or read its files: a full disk (a real tmpfs of a few
megabytes, see filesystems.py) at the snapshot copy and at a shard write, and a truncated database. Each
is one line naming the file and what to do, a non-zero exit, and no temporary file left behind; and
doing what it says works."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
from filesystems import fill, kvbench_line, on_tmpfs, recorded
from small_run import SMALL_RUN

KVBENCH = str(Path(sys.executable).parent / "kvbench")


def kvbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([KVBENCH, *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def temporaries(folder: Path) -> list[str]:
    """The atomic write's temporary files (``.NAME.XXXXXXXX``) anywhere under ``folder``."""
    return [str(p.relative_to(folder)) for p in folder.rglob(".*") if p.name != ".ingest.lock"]


def test_a_full_disk_at_the_snapshot_copy_is_named_and_leaves_no_temporary(
    small_results: Path, tmp_path: Path
) -> None:
    mount, after, log = tmp_path / "disk", tmp_path / "after", tmp_path / "log"
    after.mkdir()
    log.mkdir()
    m = shlex.quote(str(mount))
    on_tmpfs(
        mount,
        "\n".join(
            [
                f"cp -a {shlex.quote(str(small_results))}/. {m}/",
                kvbench_line(["ingest", "--out", str(mount)], log / "settle"),
                # room for everything but half a copy of the database: the snapshot copy cannot fit
                fill(mount, leave=f"$(stat -c %s {m}/kvbench.duckdb) / 2"),
                kvbench_line(["ingest", "--out", str(mount)], log / "full"),
                f"cp -a {m}/. {shlex.quote(str(after))}/",
                f"rm {m}/filler",
                kvbench_line(["ingest", "--out", str(mount)], log / "freed"),
            ]
        ),
        size="16m",
    )
    assert recorded(log / "settle")[0] == 0
    status, _, err = recorded(log / "full")
    snapshot = mount / "kvbench.snapshot.duckdb"
    assert status == 2, err
    assert err.startswith(f"kvbench: cannot write {snapshot}: No space left on device. Free space"), err
    assert "run the same command again" in err and "Traceback" not in err
    assert temporaries(after) == []  # the half-written copy is gone
    freed, _, err = recorded(log / "freed")
    assert freed == 0, err  # what it said to do works


def test_a_full_disk_at_a_shard_write_is_named_and_the_rerun_computes_only_that_problem(
    small_results: Path, tmp_path: Path
) -> None:
    mount, after, log = tmp_path / "disk", tmp_path / "after", tmp_path / "log"
    after.mkdir()
    log.mkdir()
    (lost,) = sorted((small_results / "shards").glob("*/*.parquet"))[:1]
    shard = mount / lost.relative_to(small_results)
    m = shlex.quote(str(mount))
    on_tmpfs(
        mount,
        "\n".join(
            [
                f"cp -a {shlex.quote(str(small_results))}/. {m}/",
                f"rm {shlex.quote(str(shard))}",  # one problem to compute again, on a full disk
                fill(mount),
                kvbench_line([*SMALL_RUN, "--out", str(mount)], log / "full", cwd=tmp_path),
                f"cp -a {m}/. {shlex.quote(str(after))}/",
                f"rm {m}/filler",
                kvbench_line([*SMALL_RUN, "--out", str(mount)], log / "freed", cwd=tmp_path),
            ]
        ),
        size="16m",
    )
    status, _, err = recorded(log / "full")
    assert status == 2, err
    assert err.startswith(f"kvbench: cannot write {shard}: "), err
    assert "No space left on device" in err and "Free space" in err and "Traceback" not in err
    assert temporaries(after) == []
    freed, out, err = recorded(log / "freed")
    assert freed == 0, err
    assert "1 problems computed, 2 reused" in out


def test_a_truncated_database_names_the_rebuild_that_then_works(small_results: Path, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    shutil.copytree(small_results, root)
    database = root / "kvbench.duckdb"
    with database.open("r+b") as handle:
        handle.truncate(database.stat().st_size // 2)
    done = kvbench("ingest", "--out", str(root), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(f"kvbench: {database} cannot be read: it is damaged"), done.stderr
    fix = f"`kvbench ingest --rebuild --out {root}`"
    assert fix in done.stderr and "Traceback" not in done.stderr
    rebuilt = kvbench(*fix.strip("`").split()[1:], cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    with duckdb.connect(str(database), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (3,)

"""A real file system that is full or read-only, for the tests of what kvbench says when it cannot write.

A tmpfs of a few megabytes is mounted in a mount namespace of its own (``unshare --user --map-root-user
--mount``: no root needed where user namespaces are allowed), and the commands run inside it; a write
that does not fit fails with ENOSPC, a write into a read-only mount with EROFS, exactly as on a user's
disk. The mount goes away with the namespace, so the script copies what the test inspects out first.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

KVBENCH = str(Path(sys.executable).parent / "kvbench")


@cache
def _namespaces() -> str | None:
    """Why a tmpfs cannot be mounted here, or None when it can."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs none /mnt"],
        capture_output=True,
        text=True,
    )
    return None if probe.returncode == 0 else f"no user and mount namespaces here ({probe.stderr.strip()})"


def needs_tmpfs() -> None:
    why = _namespaces()
    if why is not None:
        pytest.skip(f"a small tmpfs needs unshare --user --mount: {why}")


def on_tmpfs(mount: Path, script: str, *, size: str = "64m", timeout: int = 600) -> None:
    """Run ``script`` (sh) with a fresh tmpfs of ``size`` mounted at ``mount``; it fails the test if
    the mount or the script's own plumbing fails (the commands it checks record their status in files)."""
    needs_tmpfs()
    mount.mkdir(parents=True, exist_ok=True)
    whole = f"set -e\nmount -t tmpfs -o size={size} none {shlex.quote(str(mount))}\n{script}"
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", whole],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def fill(mount: Path, leave: str = "0") -> str:
    """A shell line that fills ``mount`` with a file ``filler``, leaving ``leave`` bytes (an arithmetic
    expression) free."""
    where = shlex.quote(str(mount))
    return (
        f"avail=$(df -B1 --output=avail {where} | tail -1); "
        f"dd if=/dev/zero of={where}/filler bs=4096 count=$(( (avail - ({leave})) / 4096 )) 2>/dev/null "
        f"|| true"
    )


def kvbench_line(args: list[str], record: Path, *, cwd: Path | None = None) -> str:
    """A shell line running kvbench with ``args`` that records its stdout, stderr and status as
    ``record``.out, .err and .rc (outside the tmpfs)."""
    quoted = " ".join(shlex.quote(a) for a in [KVBENCH, *args])
    where = f"cd {shlex.quote(str(cwd))} && " if cwd else ""
    r = shlex.quote(str(record))
    return f"if ({where}{quoted}) > {r}.out 2> {r}.err; then echo 0 > {r}.rc; else echo $? > {r}.rc; fi"


def recorded(record: Path) -> tuple[int, str, str]:
    """(status, stdout, stderr) of a line from ``kvbench_line``."""
    return (
        int(Path(f"{record}.rc").read_text()),
        Path(f"{record}.out").read_text(),
        Path(f"{record}.err").read_text(),
    )

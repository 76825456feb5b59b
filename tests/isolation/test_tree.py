"""A scorer's process tree as the watch reads it: the CPU seconds of every process below the root, those
that ended and were reaped included, and the memory they hold, each shared page once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kvbench.isolation import tree

BURN = r"""
import os, sys, time
start = time.process_time()
while time.process_time() - start < 0.4:
    pass
os.write(1, f"{time.process_time()}\n".encode())  # one write: the two burners share the pipe
if sys.argv[1] == "stay":
    time.sleep(60)
"""
TREE = f"""
import subprocess, sys
burners = [subprocess.Popen([sys.executable, "-c", {BURN!r}, how]) for how in ("stay", "end")]
burners[1].wait()  # reaped: its seconds move to this process's cutime
sys.stdout.flush()
burners[0].wait()
"""


def test_the_tree_counts_every_process_below_the_root_and_those_reaped() -> None:
    root = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert root.stdout is not None
        burned = [float(root.stdout.readline()) for _ in range(2)]  # each burner's own CPU seconds
        time.sleep(0.3)  # the second burner is reaped by then
        seconds = tree.tree_cpu_seconds(root.pid)
        assert sum(burned) <= seconds + 0.02, (burned, seconds)
        # beside the burners: three interpreters' start, far less than a second here
        assert seconds < sum(burned) + 1.0, (burned, seconds)
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(root.pid)], check=False)
        root.kill()
        root.wait()


def test_a_list_longer_than_one_read_is_read_whole(tmp_path: Path) -> None:
    listing = tmp_path / "children"
    listing.write_bytes(b" ".join(str(pid).encode() for pid in range(100000, 103000)))  # 20 KB
    assert tree._read(str(listing)) == listing.read_bytes()


HOLD = r"""
import os, sys, time
size = int(sys.argv[1]) << 20
block = bytearray(size)
block[::4096] = b"\1" * len(range(0, size, 4096))  # every page touched: resident
children = int(sys.argv[2])
for _ in range(children):  # forked after the touch: the block's pages are shared, copy on write
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
os.write(1, b"held\n")
time.sleep(60)
"""


def _held(megabytes: int, children: int, copies: int) -> int:
    """Bytes tree_resident_bytes reads for ``copies`` processes that each touched ``megabytes``, each of
    which forked ``children`` that touch nothing, all below one root."""
    root = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys\n"
            f"held = [subprocess.Popen([sys.executable, '-c', {HOLD!r}, '{megabytes}', '{children}']) "
            f"for _ in range({copies})]\n[p.wait() for p in held]",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert root.stdout is not None
        for _ in range(copies):
            assert root.stdout.readline() == b"held\n"
        time.sleep(0.2)
        return tree.tree_resident_bytes(root.pid)
    finally:
        for pid in tree.tree_pids(root.pid)[::-1]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        root.wait()


def test_the_tree_holds_what_each_process_touched_and_a_forked_page_once() -> None:
    interpreters = 64 << 20  # beside the blocks: each Python's own few MiB, shared libraries divided
    two_copies = _held(200, children=0, copies=2)
    assert 400 << 20 <= two_copies < (400 << 20) + interpreters, two_copies / 2**20
    # three children forked after the touch share its pages: counted once, not four times
    forked = _held(200, children=3, copies=1)
    assert 200 << 20 <= forked < (200 << 20) + interpreters, forked / 2**20

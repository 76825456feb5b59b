"""The CPU seconds of a scorer's process tree, as the watch reads them after every call: every process below
the root counts, those that ended and were reaped included."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from kvbench.isolation import cpu

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
        seconds = cpu.tree_cpu_seconds(root.pid)
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
    assert cpu._read(str(listing)) == listing.read_bytes()

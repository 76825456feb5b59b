"""An isolated scorer's process tree read from /proc (the CPU seconds and the resident memory of every
process in it), and the watch that stops the tree when it works past its allowance between calls or holds
more memory than its limit in all (kvbench.isolation.host)."""

from __future__ import annotations

import functools
import os
import subprocess
import threading
import time
from pathlib import Path

from kvbench.graders.sandbox import kill

POLL_SECONDS = 0.25
"""How often the watch reads the tree: what it overshoots a memory limit by is what the tree can touch in
that time."""


class TreeWatch:
    """Stops the scorer's process tree once it has used more CPU seconds since the end of its last call
    than one call may, or once its processes together hold more than ``memory_bytes`` resident. An rlimit
    counts one process's whole life and one process's address space: the threads or processes a scorer
    starts beside its call, or leaves running after it, would otherwise work unchecked between events,
    and each forked process would have the address-space limit to itself."""

    def __init__(self, process: subprocess.Popen, budget: float, memory_bytes: int) -> None:
        self.process, self.budget, self.base = process, budget, 0.0
        self.memory_bytes, self.peak_bytes = memory_bytes, 0
        self.stopped = ""
        threading.Thread(target=self._watch, daemon=True).start()

    def charge(self, budget: float) -> None:
        """A call ended: the next window starts now, with ``budget`` CPU seconds."""
        self.base, self.budget = tree_cpu_seconds(self.process.pid), budget

    def _watch(self) -> None:
        while self.process.poll() is None:
            time.sleep(POLL_SECONDS)
            tree = tree_pids(self.process.pid)  # one walk for both readings
            held = sum(map(_resident, tree))
            self.peak_bytes = max(self.peak_bytes, held)
            used = sum(map(_ticks, tree)) / os.sysconf("SC_CLK_TCK") - self.base
            if held > self.memory_bytes:
                self.stopped = (
                    f"stopped: its processes held {held / 2**30:.2f} GiB resident in all, over the limit of "
                    f"{self.memory_bytes / 2**30:g} GiB for all of them (--scorer-memory)"
                )
            elif used > self.budget:
                self.stopped = (
                    f"stopped: its processes used {used:.1f} CPU seconds since the end of its last call, "
                    f"over the limit of {self.budget:g} per call (--scorer-seconds)"
                )
            if self.stopped:
                kill(self.process)
                return


def tree_pids(root: int) -> list[int]:
    """Process ``root`` and every process below it. Each thread's list of the children it started is a
    few reads, not a walk of every process; a kernel without those lists is walked whole."""
    if not _has_children_lists():
        return _descendants_by_walk(root)
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:  # it ended
            continue
        for task in tasks:
            try:
                stack += map(int, _read(f"/proc/{pid}/task/{task}/children").split())
            except OSError:
                continue
    return found


def tree_resident_bytes(root: int) -> int:
    """Memory the processes of ``root``'s tree hold, each page counted once: the proportional set size,
    which divides a page shared by n processes (a forked child's copy-on-write pages, the request's
    mapped tensors) among them, so that forking neither multiplies nor hides what the tree holds. Where
    the kernel gives no smaps_rollup, the resident set size, which counts a shared page in each process."""
    return sum(_resident(pid) for pid in tree_pids(root))


def _resident(pid: int) -> int:
    if _has_rollup():
        try:
            text = _read(f"/proc/{pid}/smaps_rollup")
            start = text.index(b"\nPss:") + 5
            return int(text[start : text.index(b"kB", start)]) << 10
        except (OSError, ValueError):  # not ours to read (a host without root), or it ended: its RSS
            pass
    try:
        return int(_read(f"/proc/{pid}/statm").split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):  # it ended
        return 0


@functools.cache
def _has_rollup() -> bool:
    return Path(f"/proc/{os.getpid()}/smaps_rollup").exists()


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user and system) of process ``root`` and every process below it, those it has reaped
    included: bubblewrap's init reaps what its children leave, so no process of the tree escapes. Read from
    /proc, not psutil: the GPU check imports the isolation host on a GPU node that has no psutil. Paid after
    every call, so each file is read with one system call and no text decoding."""
    return sum(_ticks(pid) for pid in tree_pids(root)) / os.sysconf("SC_CLK_TCK")


@functools.cache
def _has_children_lists() -> bool:
    """Whether this kernel lists each thread's children (/proc/PID/task/TID/children)."""
    return Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists()


def _read(path: str) -> bytes:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        chunks = [os.read(descriptor, 4096)]
        while chunks[-1]:  # a list of many children is longer than one read
            chunks.append(os.read(descriptor, 4096))
        return b"".join(chunks)
    finally:
        os.close(descriptor)


def _ticks(pid: int) -> int:
    """utime, stime, cutime and cstime of ``pid``, in clock ticks; 0 once it has ended, when its parent's
    cutime and cstime hold it (once reaped)."""
    try:
        return sum(map(int, _stat(pid)[11:15]))
    except OSError:
        return 0


def _stat(pid: int) -> list[bytes]:
    text = _read(f"/proc/{pid}/stat")
    return text[text.rindex(b")") + 2 :].split()  # after the command's name, which may hold spaces


def _descendants_by_walk(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(_stat(int(entry.name))[1])
            except OSError:  # it ended
                continue
    found = []
    for pid in parents:
        up = pid
        while up > 1 and up != root:
            up = parents.get(up, 0)
        if up == root:
            found.append(pid)
    return found

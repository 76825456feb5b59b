"""The CPU seconds an isolated scorer's process tree has used, read from /proc, and the watch that stops
the tree when it works past its allowance between calls (kvbench.isolation.host)."""

from __future__ import annotations

import functools
import os
import subprocess
import threading
import time
from pathlib import Path

from kvbench.graders.sandbox import kill


class CpuWatch:
    """Stops the scorer's process tree once it has used more CPU seconds since the end of its last call
    than one call may: an rlimit counts a process's whole life, and the threads or processes a scorer
    starts beside its call, or leaves running after it, would otherwise work unchecked between events."""

    def __init__(self, process: subprocess.Popen, budget: float) -> None:
        self.process, self.budget, self.base = process, budget, 0.0
        self.stopped = ""
        threading.Thread(target=self._watch, daemon=True).start()

    def charge(self, budget: float) -> None:
        """A call ended: the next window starts now, with ``budget`` CPU seconds."""
        self.base, self.budget = tree_cpu_seconds(self.process.pid), budget

    def _watch(self) -> None:
        while self.process.poll() is None:
            time.sleep(0.5)
            used = tree_cpu_seconds(self.process.pid) - self.base
            if used > self.budget:
                self.stopped = (
                    f"stopped: its processes used {used:.1f} CPU seconds since the end of its last call, "
                    f"over the limit of {self.budget:g} per call (--scorer-seconds)"
                )
                kill(self.process)
                return


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user and system) of process ``root`` and every process below it, those it has reaped
    included: bubblewrap's init reaps what its children leave, so no process of the tree escapes. Read from
    /proc, not psutil: the GPU check imports the isolation host on a GPU node that has no psutil. Paid after
    every call, so each file is read with one system call and no text decoding."""
    if not _has_children_lists():
        return sum(_ticks(pid) for pid in _descendants_by_walk(root)) / os.sysconf("SC_CLK_TCK")
    ticks, stack = 0, [root]
    while stack:  # each thread's list of the children it started: a few reads, not a walk of every process
        pid = stack.pop()
        ticks += _ticks(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:  # it ended
            continue
        for task in tasks:
            try:
                stack += map(int, _read(f"/proc/{pid}/task/{task}/children").split())
            except OSError:
                continue
    return ticks / os.sysconf("SC_CLK_TCK")


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

"""The CPU seconds an isolated scorer's process tree has used, read from /proc, and the watch that stops
the tree when it works past its allowance between calls (kvbench.isolation.host)."""

from __future__ import annotations

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
    /proc, not psutil: the GPU check imports the isolation host on a GPU node that has no psutil."""
    try:
        tree = _descendants(root)
    except FileNotFoundError:  # a kernel without /proc/PID/task/TID/children: walk every process
        tree = _descendants_by_walk(root)
    total = 0
    for pid in tree:
        try:
            total += sum(int(f) for f in _stat(pid)[11:15])  # utime stime cutime cstime
        except OSError:  # it ended; its parent's cutime and cstime hold it once reaped
            continue
    return total / os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()  # after the command's name, which may hold spaces


def _descendants(root: int) -> list[int]:
    """``root`` and the processes below it, from each thread's list of the children it started: a few
    reads per event, where walking every process of the machine cost milliseconds per event."""
    if not Path(f"/proc/{root}/task/{root}/children").exists() and Path(f"/proc/{root}").exists():
        raise FileNotFoundError("no /proc/PID/task/TID/children here")
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                stack += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
            except OSError:
                continue
    return found


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

"""The operating-system boundary around model-written programs: bubblewrap (Debian's `bubblewrap`).

Every program runs in fresh user, mount, PID, IPC, UTS, cgroup and network namespaces made by ``bwrap``,
started as an unprivileged user (a fresh, unused uid when the grader is root; ``nobody`` inside), with no
capabilities and no way to make further user namespaces (in one, an unprivileged process may mount a
tmpfs of any size):

- the file system is ``/usr`` read-only (the interpreter and its libraries), the program's folder
  read-only, a fresh size-capped tmpfs as the only writable place, a private ``/proc`` and a minimal,
  read-only ``/dev`` (its device nodes work; ``/dev/shm`` and ``/dev`` itself take no files, which would be
  memory no limit counts); no home, no dataset cache, no /etc, nothing of the grader's;
- a seccomp filter refuses ``memfd_create`` and ``shmget``: memory that outlives its mapping, which the
  address-space limit does not count;
- the environment is cleared; the network namespace has only its own loopback;
- rlimits cap CPU time, address space, file size, open files and processes (the last one counted for
  that user alone, so a fork bomb stops at the cap);
- the whole process tree dies with the namespace's init when the program ends or the wall limit kills
  it, so nothing outlives grading and the wall limit is a hard limit;
- stdout, stderr and the result channel are read with a byte cap each; over the cap the tree is killed.

Where bwrap is missing or cannot make its namespaces, :func:`check` raises with what to install or
enable: there is no weaker fallback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import resource
import secrets
import selectors
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from kvbench.errors import PrerequisiteError

HARNESS = Path(__file__).with_name("sandbox_child.py")
NOBODY = 65534
"""The user the program sees itself as, inside its user namespace."""
FIRST_UID, UIDS = 1_500_000_000, 500_000_000
"""Outside, each sandbox runs as a user drawn from this range, which no account uses."""
BWRAP_ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
SETPRIV = "/usr/bin/setpriv"
"""util-linux's setpriv: switches root to the fresh user where bwrap must start from root (as_fresh_user)."""
INSIDE = "/sandbox"
"""Where the program's folder (read-only) appears inside the sandbox."""


REFUSED_CALLS = {
    "x86_64": (0xC000003E, {"memfd_create": 319, "shmget": 29}),
    "aarch64": (0xC00000B7, {"memfd_create": 279, "shmget": 194}),
}
"""Per machine: its audit architecture and the system calls the seccomp filter refuses (memory that
outlives its mapping: a file in memory, a System V shared-memory segment)."""


@dataclass(frozen=True)
class BoundaryLimits:
    """What a process tree behind the boundary may hold: the code grader's programs (Limits) and isolated
    scorers (kvbench.isolation.host's IsolationLimits) alike."""

    memory_bytes: int = 1 << 30
    """Address space of each of its processes."""
    file_bytes: int = 16 << 20
    """Largest file it may write (into its tmpfs; a file in memory, memfd, counts too)."""
    scratch_bytes: int = 64 << 20
    """Size of the tmpfs at /tmp, the one place it may write."""
    processes: int = 16
    """Processes and threads of its user, bubblewrap's own two included (process_cap)."""
    open_files: int = 64
    """Open file descriptors of each of its processes."""

    def caps(self) -> dict[int, int]:
        """The rlimits of its processes."""
        return {
            resource.RLIMIT_AS: self.memory_bytes,
            resource.RLIMIT_CORE: 0,
            resource.RLIMIT_FSIZE: self.file_bytes,
            resource.RLIMIT_NOFILE: self.open_files,
            resource.RLIMIT_NPROC: process_cap(self.processes),
        }


@dataclass(frozen=True)
class Limits(BoundaryLimits):
    cpu_seconds: int = 4
    wall_seconds: float = 10.0
    output_bytes: int = 8 << 20
    """Bytes read from stdout (and from stderr, and from the result channel) before the tree is killed."""

    def caps(self) -> dict[int, int]:
        return {**super().caps(), resource.RLIMIT_CPU: self.cpu_seconds}


@dataclass(frozen=True)
class Outcome:
    stdout: bytes
    stderr: bytes
    result: bytes
    """What the harness wrote to the result channel (functional problems), read on a pipe the program
    never holds."""
    status: int | None
    """Exit status of the program (None when it was killed by the grader)."""
    killed: str | None = None
    """Why the grader killed it: ``timeout`` or ``output limit``."""


class SandboxUnavailableError(PrerequisiteError):
    """The boundary cannot be set up on this machine; code tasks refuse to run."""


def system_mounts(interpreter: Path) -> list[str]:
    """bwrap arguments binding the system's programs and libraries read-only (and ``interpreter``'s own
    installation when it lies outside /usr)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        path = Path(top)
        if path.is_symlink():  # merged /usr: /lib -> usr/lib
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            args += ["--ro-bind", top, top]
    prefix = Path(sys.base_prefix).resolve()
    if not interpreter.is_relative_to("/usr") and prefix.is_dir():
        args += ["--ro-bind", str(prefix), str(prefix)]  # an interpreter outside /usr (pyenv, conda)
    return args


@cache
def interpreter() -> Path:
    """The Python that runs programs: the system's /usr/bin/python3 where there is one (it needs no
    folder outside /usr), else this process's own base interpreter."""
    system = Path("/usr/bin/python3")
    return system if system.is_file() else Path(sys.executable).resolve()


def process_cap(processes: int) -> int:
    """RLIMIT_NPROC for a sandbox that may run ``processes`` processes and threads of its own. The limit
    counts every task of the real user: a fresh user has none but the sandbox's, while an unprivileged
    grader's sandbox runs as the grader's own user, whose tasks already running are added."""
    return processes if os.geteuid() == 0 else processes + tasks_of(os.getuid())


def tasks_of(uid: int) -> int:
    """Processes and threads whose real user is ``uid``, now."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            lines = Path(f"/proc/{entry.name}/status").read_text().splitlines()
        except OSError:  # it ended
            continue
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        if int(fields["Uid"].split()[0]) == uid:
            count += int(fields["Threads"])
    return count


def as_fresh_user(command: list[str]) -> tuple[list[str], dict[str, Any]]:
    """A bwrap ``command`` and the Popen arguments that run it as a fresh unprivileged user, a user id no
    account uses drawn anew, when this process is root; as itself otherwise.

    Root's process count is never limited; a user of its own per program is, and shares its count with
    nothing else (not even the exited sandboxes that the system has yet to reap).

    bwrap, started as that user, must reach every folder it binds. One that lies under a folder only root
    may enter (a Python installed in root's home, mode 0700) is out of its reach: then bwrap starts from
    root in a mount namespace of its own, where that private folder is an empty tmpfs showing only the
    folders bound (nothing else of it), and ``setpriv`` switches to the fresh user, with no capabilities
    and no new privileges, before the command's own bwrap starts.
    """
    sources = [Path(command[i + 1]) for i, arg in enumerate(command[:-1]) if arg == "--ro-bind"]
    hidden = [source for source in sources if not _reachable(source)]
    uid = FIRST_UID + secrets.randbelow(UIDS) if os.geteuid() == 0 else None
    if uid is None:
        return command, {}
    if not hidden:
        return command, {"user": uid, "group": uid, "extra_groups": []}
    view = ["--dev-bind", "/", "/", *_shown(hidden), "--die-with-parent", "--"]
    switch = [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]
    return [command[0], *view, *switch, *command], {}


def _reachable(folder: Path) -> bool:
    """Whether any user may enter ``folder`` and each folder above it."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in (folder, *folder.parents))


def _shown(folders: list[Path]) -> list[str]:
    """bwrap arguments that show each of ``folders`` read-only at its own path, over an empty tmpfs in
    place of the topmost folder above it that other users may not enter."""
    args: list[str] = []
    made: set[Path] = set()
    for folder in folders:
        above = [*reversed(folder.parents)]
        top = next((p for p in above if not p.stat().st_mode & stat.S_IXOTH), None)
        if top is None:  # the folder itself is private: bound, it would still be unreadable
            raise SandboxUnavailableError(
                f"{folder} cannot be read by an unprivileged user, and the sandbox runs as one: "
                f"chmod o+rx {folder}"
            )
        for step in above[above.index(top) :]:
            if step not in made:
                made.add(step)
                args += ["--perms", "0755", "--tmpfs" if step == top else "--dir", str(step)]
        args += ["--ro-bind", str(folder), str(folder)]
    return args


def rlimits(caps: dict[int, int]) -> Callable[[], None]:
    """A ``preexec_fn`` that sets each resource's soft and hard limit to its cap."""

    def apply() -> None:
        for which, value in caps.items():
            resource.setrlimit(which, (value, value))

    return apply


def program_folder(prefix: str, files: dict[str, bytes]) -> Path:
    """A fresh folder holding ``files`` (name -> content), readable by the unprivileged user that runs the
    sandbox, to be bound read-only inside it; the caller removes it."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    for name, data in files.items():
        (folder / name).write_bytes(data)
        (folder / name).chmod(0o644)
    folder.chmod(0o755)
    return folder


def launch(command: list[str], preexec_fn: Callable[[], None], **popen: Any) -> subprocess.Popen:
    """Start bwrap's ``command`` in a session of its own (so that :func:`kill` takes its whole tree), with
    stdin, stdout and stderr as pipes and only BWRAP_ENVIRONMENT: bwrap's own processes are visible
    inside, and they carry no secret either."""
    return subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=BWRAP_ENVIRONMENT,
        preexec_fn=preexec_fn,
        start_new_session=True,
        **popen,
    )


def kill(process: subprocess.Popen) -> None:
    """Kill bwrap's process group; the namespace's init dies with it, and every process inside with it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def refused_calls() -> int:
    """A file descriptor holding the seccomp program for bwrap's ``--seccomp``: the calls of
    REFUSED_CALLS fail with EPERM, and so does every call made through another architecture's entry (a
    32-bit or x32 call on x86_64 has other numbers). The caller passes it to bwrap and then closes it."""
    machine = platform.machine()
    if machine not in REFUSED_CALLS:
        raise SandboxUnavailableError(
            f"the sandbox's seccomp filter knows the system calls of {', '.join(REFUSED_CALLS)}, not of "
            f"{machine}: add its numbers to kvbench.graders.sandbox.REFUSED_CALLS"
        )
    arch, numbers = REFUSED_CALLS[machine]
    load, equal, at_least, give = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JGE|K, BPF_RET|K
    allow, refuse = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO
    n = len(numbers)
    program = [(load, 0, 0, 4), (equal, 0, n + 3, arch), (load, 0, 0, 0), (at_least, n + 1, 0, 0x40000000)]
    program += [(equal, n - i, 0, number) for i, number in enumerate(numbers.values())]  # to "refuse"
    program += [(give, 0, 0, allow), (give, 0, 0, refuse)]
    fd = os.memfd_create("kvbench-seccomp")
    os.write(fd, b"".join(struct.pack("=HBBI", *op) for op in program))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def boundary(
    bwrap: str,
    python: Path,
    folders: list[tuple[str, str]],
    scratch_bytes: int,
    environment: dict[str, str],
    seccomp_fd: int,
    *,
    read_only_root: bool = False,
) -> list[str]:
    """The bwrap arguments up to the program: fresh namespaces, no capabilities, the seccomp program of
    ``seccomp_fd`` (:func:`refused_calls`), the system and ``python`` read-only, each (outside, inside)
    folder read-only, a ``scratch_bytes`` tmpfs at /tmp as the working folder, and an environment of PATH,
    HOME, LANG and ``environment`` only. ``read_only_root``: the new root itself is read-only too (bwrap
    makes it a tmpfs that holds the mount points)."""
    binds = [arg for outside, inside in folders for arg in ("--ro-bind", outside, inside)]
    variables = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", **environment}
    return [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(NOBODY),
        "--gid",
        str(NOBODY),
        "--hostname",
        "sandbox",
        "--seccomp",
        str(seccomp_fd),
        *system_mounts(python),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--remount-ro",
        "/dev",
        "--size",
        str(scratch_bytes),
        "--tmpfs",
        "/tmp",
        *binds,
        *(["--remount-ro", "/"] if read_only_root else []),
        "--chdir",
        "/tmp",
        "--clearenv",
        *[arg for name, value in variables.items() for arg in ("--setenv", name, value)],
        "--",
    ]


class Sandbox:
    """Runs programs inside bubblewrap. ``bwrap`` names the executable (default: the one on PATH)."""

    def __init__(self, bwrap: str | None = None) -> None:
        self.bwrap = bwrap or shutil.which("bwrap")

    def command(
        self, folder: str, argv: list[str], limits: Limits, result_fd: int = -1, seccomp_fd: int = -1
    ) -> list[str]:
        """The bwrap command line running ``argv`` with the folder ``folder`` bound read-only inside."""
        python = interpreter()
        argv = [a.replace("{result_fd}", str(result_fd)) for a in argv]
        environment = {"PYTHONHASHSEED": "0"}
        inside = boundary(
            str(self.bwrap), python, [(folder, INSIDE)], limits.scratch_bytes, environment, seccomp_fd
        )
        return [*inside, str(python), "-I", "-S", *argv]

    def check(self) -> None:
        """Raise SandboxUnavailableError, saying what to install or enable, unless the boundary works here."""
        problem = _probe(self.bwrap)
        if problem is not None:
            raise SandboxUnavailableError(problem)

    def run(self, files: dict[str, str], argv: list[str], stdin: bytes, limits: Limits) -> Outcome:
        """Run ``argv`` (names of ``files`` become their paths inside) under the boundary.

        The token ``{result_fd}`` in ``argv`` becomes the number of the result channel's write end.
        """
        self.check()
        return self._run(files, argv, stdin, limits)

    def _run(self, files: dict[str, str], argv: list[str], stdin: bytes, limits: Limits) -> Outcome:
        folder = program_folder("kvbench-program-", {name: text.encode() for name, text in files.items()})
        try:
            inside = [f"{INSIDE}/{a}" if a in files else a for a in argv]
            return _supervise(lambda *fds: self.command(str(folder), inside, limits, *fds), stdin, limits)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


@cache
def _probe(bwrap: str | None) -> str | None:
    """None when bwrap can make its namespaces here; otherwise what is wrong and how to fix it."""
    if bwrap is None or not Path(bwrap).is_file():
        return (
            "code tasks run model-written programs inside bubblewrap, which is not installed: "
            "apt-get install bubblewrap (Debian/Ubuntu) or dnf install bubblewrap, then run again"
        )
    try:  # the way every program runs, under the default limits and a longer wall limit
        done = Sandbox(bwrap)._run({}, ["-c", "print('ok')"], b"", Limits(wall_seconds=60))
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap ({bwrap}) could not start: {exc}"
    if done.status != 0 or done.stdout.strip() != b"ok":
        reason = done.stderr.decode(errors="replace").strip() or done.killed or f"exit {done.status}"
        return (
            f"bubblewrap ({bwrap}) cannot create its namespaces here ({reason}): enable unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1, or user.max_user_namespaces > 0; in a "
            "container, allow them in its security profile); code tasks do not run without the boundary"
        )
    return None


def _supervise(command: Callable[[int, int], list[str]], stdin: bytes, limits: Limits) -> Outcome:
    """Start the sandbox, feed stdin, read every output with its cap, and kill the tree at the limits.
    ``command`` takes the result channel's and the seccomp program's file descriptors."""
    result_read, result_write = os.pipe()
    seccomp = refused_calls()
    try:
        line, user = as_fresh_user(command(result_write, seccomp))
        process = launch(line, rlimits(limits.caps()), pass_fds=(result_write, seccomp), **user)
    finally:
        os.close(seccomp)
    os.close(result_write)
    assert process.stdin and process.stdout and process.stderr  # all three were opened as pipes
    threading.Thread(target=_feed, args=(process.stdin, stdin), daemon=True).start()
    streams = {process.stdout.fileno(): "stdout", process.stderr.fileno(): "stderr", result_read: "result"}
    read: dict[str, bytearray] = {name: bytearray() for name in streams.values()}
    selector = selectors.DefaultSelector()
    for fd in streams:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + limits.wall_seconds
    killed: str | None = None
    while selector.get_map() and killed is None:  # a stream leaves the selector at its end
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            killed = "timeout"
            break
        for key, _ in selector.select(timeout=min(remaining, 0.5)):
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                selector.unregister(key.fd)
                continue
            buffer = read[streams[key.fd]]
            buffer += chunk
            if len(buffer) > limits.output_bytes:
                killed = "output limit"
                del buffer[limits.output_bytes :]
                break
    status: int | None = None
    if killed is None:
        try:
            status = process.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            killed = "timeout"
    if killed is not None:
        kill(process)
    selector.close()
    os.close(result_read)
    for pipe in (process.stdin, process.stdout, process.stderr):
        pipe.close()
    return Outcome(bytes(read["stdout"]), bytes(read["stderr"]), bytes(read["result"]), status, killed)


def _feed(pipe, data: bytes) -> None:
    # the program may exit (or be killed) without reading all of its input
    with contextlib.suppress(BrokenPipeError, OSError, ValueError):
        pipe.write(data)
        pipe.close()

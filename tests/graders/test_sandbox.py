"""The sandbox is a boundary: hostile programs graded as the grader grades them, and the boundary alone.

Every attack is written so that an escape *would* be graded correct: the payload prints the expected
output only when its attack reached something outside the sandbox (the grader's secret, a planted
file's content, a listening socket). Each test then checks, from outside, that nothing outside the
scratch folder changed, that no process survived, that the wall limit held, and why the test failed.

Each attack runs twice: through ``grade_code`` (the real harness, whose audit hook is only defence in
depth) and ``bare`` (a harness that runs the program with no hook at all), so that the operating-system
boundary is shown to hold on its own.
"""

from __future__ import annotations

import os
import resource
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvbench.errors import PrerequisiteError
from kvbench.graders.code import CodeTest, Limits, grade_code
from kvbench.graders.sandbox import Sandbox, SandboxUnavailableError
from support import needs_sandbox

LIMITS = Limits(cpu_seconds=2, wall_seconds=4, memory_bytes=512 << 20, output_bytes=1 << 20)
BARE = "import sys\nexec(compile(open(sys.argv[1]).read(), 'solution.py', 'exec'))\n"


pytestmark = needs_sandbox


@dataclass
class Host:
    """What lies outside the sandbox: a folder with a victim file and a secret, an environment variable
    and a listening socket, all of which a contained program must never reach."""

    folder: Path
    victim: Path
    secret: Path
    token: str
    listener: socket.socket

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    def snapshot(self) -> dict[str, tuple[bytes, int]]:
        return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(self.folder.rglob("*"))}

    def connections(self) -> int:
        count = 0
        self.listener.setblocking(False)
        while True:
            try:
                self.listener.accept()[0].close()
                count += 1
            except BlockingIOError:
                return count


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    folder = tmp_path / "host"
    folder.mkdir()
    token = secrets.token_hex(8)
    (folder / "victim.txt").write_text("original")
    (folder / "secret.txt").write_text(token)
    monkeypatch.setenv("KVBENCH_SECRET", token)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    yield Host(folder, folder / "victim.txt", folder / "secret.txt", token, listener)
    listener.close()


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the name in parentheses may hold spaces


def _started_by_another_worker(pid: int) -> bool:
    """Whether ``pid`` descends from a sibling of this process: another xdist worker of this test run,
    whose own sandboxes may be running right now. Anything else (this process's, an orphan) counts."""
    mine, shared_parent = os.getpid(), os.getppid()
    while pid not in (None, 0, 1, mine):
        parent = _parent(pid)
        if parent == shared_parent and shared_parent != 1:
            return True
        pid = parent
    return False


def _survivors() -> list[str]:
    """Host processes still running a sandboxed program (the harness's path is in their command line),
    other than those another xdist worker is running now."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            sandboxed = b"/sandbox/harness.py" in line or b"kvbench-program-" in line
            if sandboxed and not _started_by_another_worker(int(entry.name)):
                found.append(line.decode(errors="replace"))
    return found


def attack(host: Host, payload: str, expected: str, mode: str, *, limits: Limits = LIMITS) -> str:
    """Run ``payload`` (formatted with the host's facts) as a program whose right answer is ``expected``;
    return why it failed, after checking that the boundary held."""
    code = payload.format(
        victim=host.victim, secret=host.secret, folder=host.folder, port=host.port, token_len=len(host.token)
    )
    before = host.snapshot()
    environment = dict(os.environ)
    started = time.monotonic()
    if mode == "graded":
        verdict = grade_code(f"```python\n{code}\n```", [CodeTest("", expected, "stdin")], limits=limits)
        assert not verdict.correct, f"escaped: {verdict}"
        reason = verdict.reason.split(": ", 1)[1]
    else:
        outcome = Sandbox().run(
            {"solution.py": code, "harness.py": BARE}, ["harness.py", "solution.py"], b"", limits
        )
        assert outcome.stdout.decode(errors="replace").strip() != expected, "escaped with no hook"
        reason = outcome.killed or ("exit 0" if outcome.status == 0 else f"exit {outcome.status}")
    elapsed = time.monotonic() - started
    assert elapsed < limits.wall_seconds + 3, f"the wall limit did not hold: {elapsed:.1f} s"
    assert host.snapshot() == before, "a file outside the sandbox changed"
    assert dict(os.environ) == environment
    assert host.connections() == 0, "a connection reached the host's loopback"
    time.sleep(0.2)
    assert _survivors() == [], "a sandboxed process outlived grading"
    return reason


MODES = ["graded", "bare"]

ENVIRONMENT = {
    "os.environ": "import os\nprint(os.environ.get('KVBENCH_SECRET', ''))",
    "/proc/PPID/environ": (
        "import os\nfor p in range(1, 4):\n"
        "    try:\n        t = open(f'/proc/{{p}}/environ').read()\n    except OSError:\n        continue\n"
        "    if 'KVBENCH_SECRET=' in t:\n        print(t.split('KVBENCH_SECRET=')[1].split(chr(0))[0])"
    ),
    "unresolved /proc paths": (
        "import os\nppid = os.getppid()\n"
        "for path in (f'//proc/{{ppid}}/environ', f'/proc/self/../{{ppid}}/environ',"
        " f'../../proc/{{ppid}}/environ'):\n"
        "    try:\n        t = open(path).read()\n    except OSError:\n        continue\n"
        "    if 'KVBENCH_SECRET=' in t:\n        print(t.split('KVBENCH_SECRET=')[1].split(chr(0))[0])"
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("route", list(ENVIRONMENT))
def test_the_graders_environment_is_out_of_reach(host: Host, route: str, mode: str) -> None:
    assert attack(host, ENVIRONMENT[route], host.token, mode) in ("wrong answer", "exit 0")


def test_a_planted_secret_file_cannot_be_read(host: Host) -> None:
    for mode in MODES:
        reason = attack(host, "print(open('{secret}').read())", host.token, mode)
        assert reason == "exit 1"  # FileNotFoundError: the host's folder does not exist inside


# Each family of writing syscalls, aimed at the planted victim. The payload first proves it sees the
# host's file (its content), so that a write inside the sandbox's own tmpfs can never count as escape.
SEES = "import os\nsees = lambda: open('{victim}').read() == 'original'\n"
WRITES = {
    "rename": "os.rename('/tmp/x', '{victim}')",
    "remove with dir_fd": "os.remove('victim.txt', dir_fd=os.open('{folder}', os.O_RDONLY))",
    "open O_TRUNC": "os.open('{victim}', os.O_RDONLY | os.O_TRUNC)",
    "open O_CREAT": "os.open('{folder}/new.txt', os.O_CREAT | os.O_WRONLY)",
    "write through dir_fd": "os.open('new.txt', os.O_CREAT | os.O_WRONLY, dir_fd=os.open('{folder}', 0))",
    "link": "os.link('{victim}', '{folder}/linked')",
    "symlink": "os.symlink('/etc/passwd', '{folder}/link')",
    "chown": "os.chown('{victim}', 0, 0)",
    "mkfifo": "os.mkfifo('{folder}/fifo')",
    "setxattr": "os.setxattr('{victim}', 'user.kvbench', b'x')",
    "mknod": "os.mknod('{folder}/null', 0o20666, os.makedev(1, 3))",
    "sqlite3": "import sqlite3\nsqlite3.connect('{folder}/db.sqlite').execute('create table t (x)')",
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", list(WRITES))
def test_no_write_reaches_the_host(host: Host, family: str, mode: str) -> None:
    payload = SEES + f"open('/tmp/x', 'w').close()\n{WRITES[family]}\nif sees():\n    print('ESCAPED')"
    assert attack(host, payload, "ESCAPED", mode).startswith("exit ")


TAMPER = (
    "import sys, os\n"
    "main = sys.modules['__main__']\n"
    "for name in list(vars(main)):\n"
    "    value = getattr(main, name)\n"
    "    if isinstance(value, (set, dict, list)):\n"
    "        value.clear()\n"
    "try:\n"
    "    import gc\n"
    "    for f in gc.get_objects():\n"
    "        if callable(f) and getattr(f, '__name__', '') == 'guard':\n"
    "            f.__code__ = (lambda event, args: None).__code__\n"
    "except Exception:\n"
    "    pass\n"
    "os.system('cat {secret}')\n"
)


@pytest.mark.parametrize("mode", MODES)
def test_tampering_with_the_audit_hook_gains_nothing(host: Host, mode: str) -> None:
    assert attack(host, TAMPER, host.token, mode) in ("exit 1", "exit 0", "wrong answer")


ESCAPE = (
    "import os, time\n"
    "try:\n"
    "    import _posixsubprocess\n"
    "except ImportError:\n"
    "    _posixsubprocess = None\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        time.sleep(60)\n"
    "    os._exit(0)\n"
    "print('7')\n"
)


@pytest.mark.parametrize("mode", MODES)
def test_no_process_outlives_grading(host: Host, mode: str) -> None:
    """A forked, setsid, double-forked sleeper: dies with the sandbox (checked in ``attack``)."""
    attack(host, ESCAPE, "never printed", mode)


STALL = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    time.sleep(60)  # holds stdout open\n"
    "print('7')\n"
    "sys.stdout.flush()\n"
    "os._exit(0)\n"
)


@pytest.mark.parametrize("mode", MODES)
def test_a_grandchild_holding_stdout_cannot_stall_the_grader(host: Host, mode: str) -> None:
    # the grandchild dies with the sandbox's PID namespace when the program exits, closing stdout;
    # the hook (graded mode) refuses the fork first
    started = time.monotonic()
    reason = attack(host, STALL, "never printed", mode)
    assert reason == ("exit 1" if mode == "graded" else "exit 0")
    assert time.monotonic() - started < LIMITS.wall_seconds + 2


NETWORK = "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('ESCAPED')\n"


@pytest.mark.parametrize("mode", MODES)
def test_the_hosts_loopback_is_unreachable(host: Host, mode: str) -> None:
    assert attack(host, NETWORK, "ESCAPED", mode) == "exit 1"


def test_without_the_boundary_code_tasks_refuse_and_nothing_runs(host: Host, tmp_path: Path) -> None:
    public = Path(tempfile.mkdtemp(prefix="kvbench-fake-bwrap-"))  # reachable by the unprivileged user
    public.chmod(0o755)
    broken = public / "bwrap"
    broken.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    broken.chmod(0o755)
    for sandbox, message in (
        (Sandbox(str(broken)), "cannot create its namespaces here .*Permission denied.*enable unprivileged"),
        (Sandbox(str(tmp_path / "missing")), "not installed: apt-get install bubblewrap"),
    ):
        with pytest.raises(SandboxUnavailableError, match=message):
            grade_code("```python\nprint(7)\n```", [CodeTest("", "7", "stdin")], sandbox=sandbox)
    shutil.rmtree(public)
    assert host.connections() == 0
    assert issubclass(SandboxUnavailableError, PrerequisiteError)  # kvbench's CLI prints it, exit 2


@pytest.mark.parametrize("mode", MODES)
def test_hostile_output_encoding_is_a_verdict(host: Host, mode: str) -> None:
    payload = (
        "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\x80 7 \\xc3')\nsys.stderr.buffer.write(b'\\xff')"
    )
    assert attack(host, payload, "7", mode) in ("wrong answer", "exit 0")


FORGED = (
    "import os, sys\n"
    "print('[2, 4, 6]')\n"
    "{forge}"
    "class Solution:\n"
    "    def scale(self, xs, k):\n"
    "        {body}\n"
)


# Writing the right answer to every descriptor it has reaches only the worker's own pipe, whose bytes
# then precede the returned value's: the harness forwards them, the grader's parser refuses them.
EVERY_FD = "for fd in range(3, 64):\n    try:\n        os.write(fd, b'[2, 4, 6]')\n    except OSError:\n"
EVERY_FD += "        pass\n"


@pytest.mark.parametrize(
    ("forge", "body", "reason"),
    [
        ("", "return None", "wrong answer"),  # the right answer on stdout is never read as the result
        (EVERY_FD, "return None", "malformed result"),
        ("", "x = []\n        for _ in range(100000):\n            x = [x]\n        return x", "exit 1"),
        ("", "sys.__stdout__.write('{{' * 100000)\n        return 0", "wrong answer"),
    ],
)
def test_forged_protocol_data_is_never_believed(host: Host, forge: str, body: str, reason: str) -> None:
    tests = [CodeTest("[1, 2, 3]\n2", "[2, 4, 6]", "functional")]
    code = FORGED.format(forge=forge, body=body)
    verdict = grade_code(f"```python\n{code}\n```", tests, "scale", limits=LIMITS)
    assert not verdict.correct and verdict.reason == f"test 0: {reason}"
    assert _survivors() == []


def test_a_malformed_result_on_the_channel_is_a_verdict(host: Host) -> None:
    # a value whose JSON nests deeper than the grader's parser goes: refused, never a crash
    tests = [CodeTest("[1]\n1", "[1]", "functional")]
    code = "import sys\nsys.setrecursionlimit(10**6)\nclass Solution:\n    def scale(self, xs, k):\n"
    code += "        x = []\n        for _ in range(50000):\n            x = [x]\n        return x"
    verdict = grade_code(f"```python\n{code}\n```", tests, "scale", limits=LIMITS)
    assert not verdict.correct
    assert verdict.reason == "test 0: malformed result" or verdict.reason.startswith("test 0: exit ")


@pytest.mark.parametrize("mode", MODES)
def test_an_output_flood_is_capped(host: Host, mode: str) -> None:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    payload = "import sys\nblock = b'7' * (1 << 20)\nfor _ in range(300):\n    sys.stdout.buffer.write(block)"
    assert attack(host, payload, "7", mode) == "output limit"
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    assert grown_mib < 64, f"300 MB of output raised the grader's peak memory by {grown_mib:.0f} MiB"


def test_correct_livecodebench_solutions_pass_through_the_boundary() -> None:
    from kvbench.specs.task import load_task
    from kvbench.specs.task_data import load_problems

    fixture = (
        Path(__file__).resolve().parents[1] / "fixtures" / "hub" / "livecodebench" / "code_generation_lite"
    )
    problems = {p.problem_id: p for p in load_problems(load_task("lcb-v6"), fixture)}
    solutions = {
        "fx1": "a, b = map(int, input().split())\nprint(a + b)",
        "fx2": "class Solution:\n    def scale(self, xs, k):\n        return [x * k for x in xs]",
    }
    for problem_id, code in solutions.items():
        gold = problems[problem_id].gold
        verdict = grade_code(f"```python\n{code}\n```", gold["tests"], gold["function"])
        assert verdict.correct, (problem_id, verdict)


def test_a_programs_cpu_seconds_and_open_files_are_capped() -> None:
    """The code grader's rlimits (BoundaryLimits.caps and the CPU seconds Limits adds): a busy loop is
    stopped at its CPU limit, long before its wall limit, and opening files fails past the open-file cap."""
    started = time.monotonic()
    spin = Sandbox().run(
        {"spin.py": "while True:\n    pass\n"}, ["spin.py"], b"", Limits(cpu_seconds=1, wall_seconds=60)
    )
    assert spin.killed is None and spin.status not in (0, None) and time.monotonic() - started < 30
    program = (
        "import errno, os\nfds = []\ntry:\n    for _ in range(200):\n"
        "        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
        "except OSError as exc:\n    print(errno.errorcode[exc.errno], len(fds) < 32)\n"
    )
    files = Sandbox().run({"files.py": program}, ["files.py"], b"", Limits(open_files=32))
    assert files.stdout == b"EMFILE True\n", files.stderr

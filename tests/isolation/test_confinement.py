"""An isolated scorer confined in every resource: it writes nowhere but its capped /tmp, runs as a user of
its own (neither root nor nobody's 65534 outside), and its processes, open files, file sizes, CPU seconds
and start are limited, each limit named when it is hit. What fails on kvbench's side is named as such, and
a scorer's error carries its own traceback lines only."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from isolated_scorers import SLOW_IMPORT, hostile, run_through, scorer, started_policy, stop_scorers  # noqa: F401 (a fixture)

from kvbench.errors import ScorerError, SpecError
from kvbench.graders.sandbox import tasks_of
from kvbench.isolation.host import IsolatedPolicy, IsolationLimits
from support import needs_sandbox

pytestmark = needs_sandbox

LIMITS = IsolationLimits()


def sandboxed(policy: IsolatedPolicy) -> list[dict]:
    """Every process below the scorer's bubblewrap, read from this side: its real uid, threads, capabilities
    and command line."""
    assert policy.process is not None
    root = policy.process.process.pid
    status: dict[int, dict[str, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines = (entry / "status").read_text().splitlines()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
            status[int(entry.name)] = {**fields, "cmdline": cmdline}
    found = []
    for pid, fields in status.items():
        up = pid
        while up not in (0, 1, root):
            up = int(status.get(up, {}).get("PPid", "0"))
        if up == root:
            found.append(
                {
                    "pid": pid,
                    "parent": int(fields["PPid"]),
                    "uids": {int(u) for u in fields["Uid"].split()},
                    "threads": int(fields["Threads"]),
                    "caps": int(fields["CapEff"], 16),
                    "cmdline": fields["cmdline"],
                }
            )
    return found


def child_of(policy: IsolatedPolicy) -> dict:
    """The scorer's own Python process (not bubblewrap, whose command line names it too, nor a process it
    forked)."""
    pythons = {p["pid"]: p for p in sandboxed(policy) if p["cmdline"].split()[1:3] == ["-I", "-m"]}
    (child,) = [p for p in pythons.values() if p["parent"] not in pythons]
    return child


def test_dev_and_dev_shm_take_no_file_and_tmp_stops_at_its_cap(tmp_path: Path) -> None:
    body = """
    said = []
    for target in ("/dev/shm/fill", "/dev/fill", "/tmp/fill"):
        written = 0
        try:
            with open(target, "wb") as out:
                while written < 100:
                    out.write(b"x" * (1 << 20))
                    out.flush()
                    written += 1
            said.append(f"{target}: {written} MiB, no error")
        except OSError as exc:
            said.append(f"{target}: {written} MiB, then errno {exc.errno}")
    raise RuntimeError("; ".join(said))
    """
    with pytest.raises(ScorerError) as raised:
        run_through(hostile(tmp_path, body), steps=20)
    message = str(raised.value)
    assert "/dev/shm/fill: 0 MiB, then errno 30" in message, message  # EROFS: /dev/shm takes nothing
    assert "/dev/fill: 0 MiB, then errno 30" in message, message
    stopped_at = int(message.split("/tmp/fill: ")[1].split(" MiB")[0])
    # the file-size limit (EFBIG) or the full tmpfs (ENOSPC), whichever comes first: both are 64 MiB
    assert stopped_at <= LIMITS.scratch_bytes >> 20, message
    assert any(f"/tmp/fill: {stopped_at} MiB, then errno {e}" in message for e in (27, 28)), message


def test_a_fork_loop_stops_at_the_process_limit_and_leaves_nothing_behind(tmp_path: Path) -> None:
    body = """
    forks = 0
    try:
        while forks < 10000:
            if os.fork() == 0:
                time.sleep(600)
                os._exit(0)
            forks += 1
    except OSError as exc:
        raise type(exc)(exc.errno, f"{exc.strerror} after {forks} forks") from None
    """
    policy = hostile(tmp_path, body)
    with pytest.raises(ScorerError) as raised:
        run_through(policy, steps=20)
    message = str(raised.value)
    assert "policy 'hostile' at layer 0, eviction event 0 raised BlockingIOError: [Errno 11]" in message
    assert f"(the limit of {LIMITS.processes} processes and threads makes fork" in message, message
    forks = int(message.split(" after ")[1].split(" forks")[0])
    assert 0 < forks < LIMITS.processes
    user = child_of(policy)["uids"]
    counted = [p for p in sandboxed(policy) if p["uids"] == user]
    assert sum(p["threads"] for p in counted) <= LIMITS.processes
    policy.close()
    (uid,) = user
    deadline = time.monotonic() + 20
    while any(p["uids"] == user for p in _all_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in _all_processes() if p["uids"] == user], "a forked process outlived the scorer"
    assert subprocess.run(["true"], check=False).returncode == 0  # this side still starts processes
    assert uid != os.getuid() or os.geteuid() != 0


def _all_processes() -> list[dict]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid_line = next(
                    x for x in (entry / "status").read_text().splitlines() if x.startswith("Uid:")
                )
            except (OSError, StopIteration):
                continue
            found.append({"pid": int(entry.name), "uids": {int(u) for u in uid_line.split()[1:]}})
    return found


def test_a_file_over_the_size_limit_is_refused_and_named(tmp_path: Path) -> None:
    body = """
    with open("/tmp/big", "wb") as out:
        for _ in range(32):
            out.write(b"x" * (1 << 20))
            out.flush()
    """
    with pytest.raises(ScorerError) as raised:
        run_through(hostile(tmp_path, body, file_bytes=8 << 20), steps=20)
    assert "raised OSError: [Errno 27] File too large (the file-size limit of 8388608 bytes)" in str(
        raised.value
    ), str(raised.value)


def test_open_files_over_the_limit_are_refused_and_named(tmp_path: Path) -> None:
    with pytest.raises(ScorerError) as raised:
        run_through(hostile(tmp_path, "kept = [open('/dev/null') for _ in range(1000)]"), steps=20)
    assert (
        "raised OSError: [Errno 24] Too many open files: '/dev/null' "
        f"(the limit of {LIMITS.open_files} open files per process)"
    ) in str(raised.value), str(raised.value)


def test_memory_that_outlives_its_mapping_is_refused(tmp_path: Path) -> None:
    """A file in memory (memfd) and a System V segment hold pages after they are unmapped, which the
    address-space limit never counts: both calls are refused."""
    body = """
    import ctypes
    said = []
    try:
        os.memfd_create("held")
        said.append("memfd made")
    except OSError as exc:
        said.append(f"memfd_create: errno {exc.errno}")
    libc = ctypes.CDLL(None, use_errno=True)
    segment = libc.shmget(0, 64 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    said.append(f"shmget: {segment}, errno {ctypes.get_errno()}")
    raise RuntimeError("; ".join(said))
    """
    with pytest.raises(ScorerError) as raised:
        run_through(hostile(tmp_path, body), steps=20)
    assert "raised RuntimeError: memfd_create: errno 1; shmget: -1, errno 1" in str(raised.value)


def test_no_user_namespace_can_be_made_to_mount_a_tmpfs_in(tmp_path: Path) -> None:
    """In a user namespace of its own, any process may mount a tmpfs of any size: host memory no limit
    counts. bwrap's --disable-userns leaves the scorer none to make."""
    body = """
    done = __import__("subprocess").run(
        ["unshare", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs none /tmp && echo mounted"],
        capture_output=True, text=True,
    )
    raise RuntimeError(f"unshare said {done.stdout.strip() or done.stderr.strip()!r}")
    """
    with pytest.raises(ScorerError) as raised:
        run_through(hostile(tmp_path, body), steps=20)
    assert "raised RuntimeError: unshare said 'unshare: unshare failed: No space left on device'" in str(
        raised.value
    ), str(raised.value)


def test_the_scorer_runs_as_a_fresh_unprivileged_user(tmp_path: Path) -> None:
    policy = hostile(tmp_path, "pass")
    run_through(policy, steps=20)  # scores, so that torch has started whatever threads it starts
    child = child_of(policy)
    (uid,) = child["uids"]  # real, effective, saved and file-system uid alike
    assert child["caps"] == 0
    if os.geteuid() == 0:  # a root host starts it as a user of its own, as the code grader's programs
        assert uid not in (0, 65534), child
    else:  # an unprivileged host starts bubblewrap as itself
        assert uid == os.getuid(), child
    other = hostile(tmp_path, "pass  # another scorer file")
    run_through(other, steps=20)
    assert child_of(other)["uids"] != child["uids"] or os.geteuid() != 0  # a fresh one for each scorer
    counted = sum(p["threads"] for p in sandboxed(policy) if p["uids"] == child["uids"])
    print(f"processes and threads of the scorer's user after scoring: {counted}")
    assert counted <= LIMITS.processes // 2  # the cap leaves room


def test_the_start_limit_follows_the_time_limit_per_call(tmp_path: Path) -> None:
    path = scorer(tmp_path, SLOW_IMPORT)
    started = time.monotonic()
    with pytest.raises(SpecError) as raised:
        started_policy(path, "SlowImport", {}, IsolationLimits(seconds_per_call=3))
    assert time.monotonic() - started < 55  # it did not wait for the import
    assert (
        f"scorer {path.name}:SlowImport: no answer within 3 s, the time limit per call (--scorer-seconds; "
        "loading the file and making the policy is one)" in str(raised.value)
    )


def test_cpu_used_beside_or_after_a_call_is_stopped_at_the_limit_per_call(tmp_path: Path) -> None:
    body = """
    import threading
    if not getattr(sys, "burning", False):
        sys.burning = True
        threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()
    """
    policy = hostile(tmp_path, body, seconds=3)
    run_through(policy, steps=20)  # the first event starts the thread, and returns
    deadline = time.monotonic() + 120
    while policy.process.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    with pytest.raises(ScorerError) as raised:
        run_through(policy, steps=20)
    assert "the scorer's process is no longer running (exit status -9; stopped: its processes used" in str(
        raised.value
    )
    assert "CPU seconds since the end of its last call, over the limit of 3 per call" in str(raised.value)


def test_forked_processes_are_held_to_one_memory_limit_for_all(tmp_path: Path) -> None:
    """Each of six forks touches 300 MiB, well inside the address space each process may have: together
    they pass the scorer's resident limit (1 GiB here), and the tree is stopped with the limit named."""
    body = """
    for _ in range(6):
        if os.fork() == 0:
            block = bytearray(300 << 20)
            block[::4096] = b"\\1" * len(range(0, 300 << 20, 4096))
            time.sleep(600)
            os._exit(0)
    time.sleep(50)
    """
    policy = hostile(tmp_path, body, seconds=55, resident_bytes=1 << 30)
    started = time.monotonic()
    with pytest.raises(ScorerError) as raised:
        run_through(policy, steps=20)
    message = str(raised.value)
    assert time.monotonic() - started < 30, message  # stopped as it passed the limit, not at the call's end
    assert re.search(r"process broke off \(exit status -9; stopped: its processes held \d\.\d\d GiB", message)
    assert "GiB resident in all, over the limit of 1 GiB for all of them (--scorer-memory)" in message
    # at most the six blocks and the interpreters: the watch read the tree, whatever it overshot by
    assert 1 << 30 < policy.process.watch.peak_bytes < 6 * (300 << 20) + (512 << 20)


def test_a_reply_this_side_cannot_read_is_named_as_the_hosts_failure(tmp_path: Path) -> None:
    body = """
    view.state.register_slot("x", torch.zeros(view.keys.shape[:3]))
    view.state._fills["x"] = "not a number"
    """
    with pytest.raises(ScorerError) as raised:
        run_through(hostile(tmp_path, body), steps=20)
    message = str(raised.value)
    assert message.startswith(
        "policy 'hostile' at layer 0, eviction event 0: kvbench (the host) could not read the scorer's "
        "reply, whose header or tensors are malformed: ValueError: could not convert string to float"
    ), message
    assert "raised ValueError" not in message


def test_a_frame_this_side_cannot_parse_is_named_as_the_hosts_failure(tmp_path: Path) -> None:
    body = """
    ours = {os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 2)}
    for fd in map(int, os.listdir("/proc/self/fd")):
        link = os.readlink(f"/proc/self/fd/{fd}") if fd > 2 else ""
        if link.startswith("pipe:") and link not in ours:  # the reply channel
            os.write(fd, (5).to_bytes(8, "big") + b"{oops")
    """
    with pytest.raises(ScorerError) as raised:
        run_through(hostile(tmp_path, body), steps=20)
    assert (
        "policy 'hostile' at layer 0, eviction event 0: kvbench (the host) could not read the scorer's reply "
        "frame, which is malformed: a header that is not JSON" in str(raised.value)
    ), str(raised.value)


def test_a_scorers_error_carries_its_own_traceback_lines_only(tmp_path: Path) -> None:
    path = scorer(
        tmp_path,
        """
        from kvbench import Policy, policy


        def norms(view):
            return view.keys.float().norm(dim=-1).numpy()


        def fails(view):
            raise ValueError("deep inside the scorer")


        @policy("numpy-scores")
        class Numpy(Policy):
            def score(self, view):
                return norms(view)


        @policy("fails-deep")
        class Deep(Policy):
            def score(self, view):
                return fails(view)
        """,
    )
    with pytest.raises(ScorerError) as raised:
        run_through(started_policy(path, "Numpy", {}), steps=20)
    message = str(raised.value)
    assert message.strip() == (
        "policy 'numpy-scores' at layer 0, eviction event 0 raised TypeError: score returned ndarray, not a "
        "Tensor"
    ), message
    with pytest.raises(ScorerError) as raised:
        run_through(started_policy(path, "Deep", {}), steps=20)
    lines = str(raised.value).splitlines()
    assert (
        lines[0]
        == "policy 'fails-deep' at layer 0, eviction event 0 raised ValueError: deep inside the scorer"
    )
    frames = [line.strip() for line in lines if line.strip().startswith("File ")]
    source = path.read_text().splitlines()
    number = {
        text: 1 + next(i for i, line in enumerate(source) if text in line) for text in ("return f", "raise V")
    }
    calls, raises = number["return f"], number["raise V"]
    assert frames == [
        f'File "/scorer/scorer.py", line {calls}, in score',
        f'File "/scorer/scorer.py", line {raises}, in fails',
    ], lines
    assert "kvbench" not in "\n".join(lines[1:])


def test_the_limits_are_what_the_docs_say() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "scorers.md").read_text()
    for text in (
        f"{LIMITS.scratch_bytes >> 20} MiB",
        f"{LIMITS.processes} processes and threads",
        f"{LIMITS.open_files} open files",
        f"{LIMITS.file_bytes >> 20} MiB per file",
        f"{LIMITS.memory_bytes >> 30} GiB of address space",
        f"{LIMITS.resident_bytes >> 30} GiB resident for all its processes together (`--scorer-memory`)",
        f"{LIMITS.start_seconds:g} s",
    ):
        assert text in docs, text


@pytest.mark.skipif(os.geteuid() != 0, reason="starts processes as another user, which only root may")
def test_the_process_count_is_the_users_own() -> None:
    """The tasks the process cap adds for an unprivileged host (whose sandbox runs as itself), counted for
    a user of its own that runs three processes, one of them with two more threads."""
    uid = 1_400_000_000 + os.getpid()
    sleeper = "threading.Thread(target=time.sleep, args=(60,)).start()"
    threads = f"import threading, time\n{sleeper}\n{sleeper}"
    started = [
        subprocess.Popen(argv, user=uid, group=uid, extra_groups=[], stdout=subprocess.PIPE)
        for argv in (["sleep", "60"], ["sleep", "60"], ["/usr/bin/python3", "-c", f"{threads}\nprint(1)"])
    ]
    try:
        assert started[2].stdout is not None and started[2].stdout.readline() == b"1\n"
        assert tasks_of(uid) == 2 + 3
    finally:
        for process in started:
            process.kill()
            process.wait()
    assert tasks_of(uid) == 0

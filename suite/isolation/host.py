"""The parent's side of an isolated scorer: its process behind the boundary, and a Policy that asks it.

The scorer's file is copied into a folder of its own and imported only inside the child process, which
runs under bubblewrap as the code grader's programs do (kvbench.graders.sandbox): fresh namespaces with
no network, the system, this Python and kvbench's own code read-only, a small tmpfs as the only writable
place, nothing else of this machine (no results, no task data, no home, no caches), as a fresh
unprivileged user whose processes, threads, open files, file sizes, memory and CPU seconds are capped
(IsolationLimits). The child sees what the policy contract gives at each event and returns scores and
its own layer state, which are checked before the engine uses them; every call has a time limit. Decoding,
the null, the full cache, graders and the store stay in the parent, which never imports the scorer.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from kvbench.core.contract import NEEDS, EvictionView, LayerState, Policy, StepView
from kvbench.errors import ScorerError, SpecError
from kvbench.graders.sandbox import (
    BoundaryLimits,
    Sandbox,
    as_fresh_user,
    boundary,
    kill,
    launch,
    program_folder,
    refused_calls,
    rlimits,
)
from kvbench.isolation import messages, serving, wire
from kvbench.isolation.arena import Arena
from kvbench.isolation.pipes import Pipes
from kvbench.isolation.tree import TreeWatch
from kvbench.registry import parse_policy_arg, refuse_builtin_name

INSIDE = "/scorer"
ARENA_INSIDE = "/arena"  # the request's tensors (kvbench.isolation.arena), bound read-only


@dataclass(frozen=True)
class IsolationLimits(BoundaryLimits):
    seconds_per_call: float = 60.0
    """The time limit of each call into the scorer's code: loading its file and making the policy, then
    each event (a score or an observed step). ``--scorer-seconds``."""
    seconds_per_run: float = 3600.0
    """The time all of one run's calls into the scorer may take together (its load included): an hour,
    about what kvbench's own policies' runs of a verified cell take many times over, so that calls each
    just under ``seconds_per_call`` cannot hold the operator's machine for days. ``--scorer-run-seconds``."""
    start_seconds: float = 180.0
    """Starting the process before any of the scorer's code runs: Python, torch and kvbench's own
    modules, which take the same time whatever the scorer is (the scorer's import is a call)."""
    cpu_seconds: float | None = None
    """CPU seconds the scorer's processes may use from the end of one call to the end of the next, all
    threads together (None: ``seconds_per_call``). A call's own thread cannot spend more than its time
    limit; this catches the threads and processes that work beside it, or go on after it returned."""
    memory_bytes: int = 16 << 30
    """Address space of each of the scorer's processes (torch reserves much more than it touches)."""
    resident_bytes: int = 4 << 30
    """Memory the scorer's processes may hold resident all together, each shared page counted once
    (kvbench.isolation.tree): the address-space limit is per process, and a scorer that forks would
    otherwise hold it once per process. ``--scorer-memory``."""
    file_bytes: int = 64 << 20
    processes: int = 32
    state_bytes: int = 2 << 30
    """The layer state the host keeps for one scorer, all layers together: a scorer's state lives in kvbench's
    process (the engine owns it), so a reply may double it at each call (reply_room) and, unbounded, the
    state would grow in kvbench's memory, outside the scorer's own limits. Per-slot accumulators at
    B = 16, Hkv = 8, K = 2048 over 36 layers take some 40 MiB; a copy of every key, about 620 MiB."""
    reply_bytes: int = 1 << 32
    """The largest reply payload at all; each reply is held to less, what its request can return
    (kvbench.isolation.messages.reply_room), before a byte of it is allocated."""
    log_bytes: int = 64 << 10
    """The last bytes of the scorer's stderr kept, for the message when it fails."""

    @property
    def cpu_per_call(self) -> float:
        return self.cpu_seconds if self.cpu_seconds is not None else self.seconds_per_call

    def named(self, code: int | None) -> str:
        """Which limit an OSError's errno from the scorer points at ('' when none)."""
        return {
            errno.EAGAIN: f"the limit of {self.processes} processes and threads makes fork and new threads "
            "fail with this error",
            errno.EMFILE: f"the limit of {self.open_files} open files per process",
            errno.EFBIG: f"the file-size limit of {self.file_bytes} bytes",
            errno.ENOSPC: f"/tmp, the one writable place, holds {self.scratch_bytes} bytes",
            errno.EROFS: f"only /tmp ({self.scratch_bytes} bytes) is writable",
        }.get(code or -1, "")


def _group_of(line: list[str], user: dict[str, Any]) -> int | None:
    """The group the scorer runs as when it is a user of its own (as_fresh_user gives it to Popen, or to
    setpriv when bwrap must start as root); None when it runs as this process's user."""
    if "group" in user:
        return int(user["group"])
    regid = next((arg for arg in line if arg.startswith("--regid=")), None)
    return int(regid.removeprefix("--regid=")) if regid else None


def _command(
    bwrap: str, folder: Path, arena: Path, class_name: str, limits: IsolationLimits, seccomp_fd: int
) -> list[str]:
    import kvbench.adapters
    import kvbench.policies

    python = Path(sys.executable)
    # kvbench's code on this machine: the package and the folders mapped into it (policies, adapters)
    packages = {Path(m.__file__).resolve().parent for m in (kvbench, kvbench.policies, kvbench.adapters)}  # type: ignore[arg-type]
    code = dict.fromkeys(str(p) for p in (Path(sys.prefix).resolve(), *sorted(packages)))
    folders = [(path, path) for path in code] + [(str(folder), INSIDE), (str(arena), ARENA_INSIDE)]
    environment = {"OMP_NUM_THREADS": "1"}
    inside = boundary(
        bwrap, python.resolve(), folders, limits.scratch_bytes, environment, seccomp_fd, read_only_root=True
    )
    return [*inside, str(python), "-I", "-m", "kvbench.isolation.child", f"{INSIDE}/scorer.py", class_name]


class ScorerProcess:
    """One scorer's process: a request, then its reply within the time limit, in turn."""

    def __init__(self, source: bytes, class_name: str, limits: IsolationLimits) -> None:
        sandbox = Sandbox()
        sandbox.check()
        self.limits = limits
        self.folder = program_folder("kvbench-scorer-", {"scorer.py": source})
        self.arena = Arena()
        seccomp = refused_calls()
        try:
            bwrap = str(sandbox.bwrap)
            command = _command(bwrap, self.folder, self.arena.folder, class_name, limits, seccomp)
            line, user = as_fresh_user(command)
            self.arena.share_with(_group_of(line, user))
            self.process = launch(line, rlimits(limits.caps()), pass_fds=(seccomp,), **user)
        finally:
            os.close(seccomp)
        assert self.process.stdin and self.process.stdout and self.process.stderr
        self.log: collections.deque[bytes] = collections.deque()
        drain = (self.process.stderr, self.log, limits.log_bytes)
        threading.Thread(target=_drain, args=drain, daemon=True).start()
        self.pipes = Pipes(self.process.stdin.fileno(), self.process.stdout.fileno())
        self._finalizer = weakref.finalize(self, _stop, self.process, self.folder, self.pipes, self.arena)
        self.watch = TreeWatch(self.process, limits.start_seconds, limits.resident_bytes)
        self.users = 0
        """The IsolatedPolicy objects holding an instance here (kvbench.isolation.host's _shared)."""

    def alive(self) -> bool:
        return self._finalizer.alive and self.process.poll() is None

    def started(self, where: str) -> None:
        """Wait for the child's first frame, sent once Python, torch and kvbench's modules are loaded and
        before any of the scorer's code runs; ScorerError past ``start_seconds``."""
        seconds = self.limits.start_seconds
        late = (
            f"did not start within {seconds:g} s (Python, torch and kvbench's modules, before the scorer's "
            "file is read)"
        )
        self._exchange(None, where, seconds, messages.REPLY_SLACK_BYTES, late)

    def call(
        self,
        header: dict[str, Any],
        tensors: dict[str, Tensor],
        where: str,
        seconds: float,
        per: str = "event",
        later: frozenset[str] = frozenset(),
        room: int = messages.REPLY_SLACK_BYTES,
    ) -> wire.Frame:
        """The reply to one request; ScorerError naming ``where`` when the scorer fails, dies or is late,
        or its reply announces more than ``room`` bytes (what the request can return, reply_room). The
        tensors named in ``later`` cross only if the scorer reads them (it asks, within the call)."""
        late = f"no answer within {seconds:g} s, the time limit per {per}"
        layout, tensors = self.arena.place(tensors, later)
        if layout:
            header = {**header, "arena": {**layout, "folder": ARENA_INSIDE}}
        return self._exchange(wire.encode(header, tensors), where, seconds, room, late)

    def _exchange(
        self, request: bytes | None, where: str, seconds: float, room: int, late: str
    ) -> wire.Frame:
        if self.process.poll() is not None:
            raise ScorerError(f"{where}: the scorer's process is no longer running ({self._exit()})")
        self.pipes.deadline = time.monotonic() + seconds
        try:
            if request is not None:
                self.pipes.write(request)
            room = min(room, self.limits.reply_bytes)
            header, tensors = wire.read(self.pipes, room)
            while header.get("op") == "fetch":  # the scorer reads a tensor held back: it crosses now
                self.pipes.write(wire.encode({"arena": self._delivered(header), "ok": True}, {}))
                header, tensors = wire.read(self.pipes, room)
        except TimeoutError:
            self.close()
            raise ScorerError(
                f"{where}: {late}; the scorer's process was stopped (a scorer must return from every call)"
            ) from None
        except (wire.WireError, OSError, ValueError) as exc:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=0.5)  # a frame cut short by the process's end: let it end
            running = self.process.poll() is None
            self.close()
            if running:  # it answered, in a frame this side cannot read
                raise ScorerError(
                    f"{where}: kvbench (the host) could not read the scorer's reply frame, "
                    f"which is malformed: {exc}; the scorer's process was stopped"
                ) from None
            raise ScorerError(f"{where}: the scorer's process broke off ({self._exit()}; {exc})") from None
        self.watch.charge(self.limits.cpu_per_call)
        if not header.get("ok"):
            limit = self.limits.named(header.get("errno"))
            raise serving.raised(where, header, f" ({limit})" if limit else "")
        return header, tensors

    def _delivered(self, header: dict[str, Any]) -> dict[str, Any]:
        names = header.get("names")
        if not isinstance(names, list) or not set(names) <= set(self.arena.pending):
            raise wire.WireError(f"a fetch of {str(names)[:80]} that the request did not hold back")
        return {**self.arena.deliver(names), "folder": ARENA_INSIDE}

    def _exit(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=2)
        status = self.process.returncode
        tail = b"".join(self.log).decode(errors="replace").strip().splitlines()[-5:]
        said = f"; its last words: {' | '.join(tail)}" if tail else ""
        why = f"; {self.watch.stopped}" if self.watch.stopped else ""
        return f"exit status {status}{why}{said}"

    def close(self) -> None:
        self._finalizer()


_SHARED: weakref.WeakValueDictionary[tuple[str, str, IsolationLimits], ScorerProcess] = (
    weakref.WeakValueDictionary()
)


def _shared(source: bytes, class_name: str, label: str, limits: IsolationLimits) -> ScorerProcess:
    """The running process of this scorer file and class under these limits, started if there is none.
    Every run of one scorer in one kvbench process (the cells of a sweep, the runs of a bundle being
    verified) makes its own instance of the class in it, so a process starts once, not once per run. The
    runs are one submitter's code either way; what each run keeps between events lives in its layer state,
    which the parent owns. A process that failed is never handed out again."""
    key = (hashlib.sha256(source).hexdigest(), class_name, limits)
    process = _SHARED.get(key)
    if process is None or not process.alive():
        process = ScorerProcess(source, class_name, limits)
        _SHARED[key] = process
        process.started(f"scorer {label}")
    return process


def _drain(stream: Any, log: collections.deque[bytes], limit: int) -> None:
    """Keep the last ``limit`` bytes (at least the last chunk) of the scorer's stderr in ``log``.

    Not a method: the thread's target is dropped when the stream ends, and one that held the ScorerProcess
    could be the last to hold it when the child dies at interpreter exit. Freeing it there frees the
    tensors its arena holds on a thread that Python is finalizing, and torch's deallocation, which
    releases the GIL and takes it back, then ends that thread inside C++ code: the interpreter aborted
    ("terminate called without an active exception") in about 1 `kvbench run --isolate` of 20."""
    size = 0
    for chunk in iter(lambda: stream.read1(1 << 14), b""):
        log.append(chunk)
        size += len(chunk)
        while size > limit and len(log) > 1:
            size -= len(log.popleft())


def _stop(process: subprocess.Popen, folder: Path, pipes: Pipes, arena: Arena) -> None:
    kill(process)
    pipes.close()
    arena.close()
    shutil.rmtree(folder, ignore_errors=True)


class IsolatedPolicy(Policy):
    """A scorer from a file, run in its own process behind the boundary; the engine sees a Policy."""

    def __init__(
        self, path: Path, class_name: str, params: dict[str, Any], limits: IsolationLimits = IsolationLimits()
    ) -> None:
        self.source = Path(path).read_bytes()
        self.class_name, self.limits = class_name, limits
        self.file_name, self.path = Path(path).name, str(path)
        self.process: ScorerProcess | None = None
        self.spent = 0.0  # seconds of this run's calls so far, against seconds_per_run
        self.state_held: dict[int, int] = {}  # the bytes of each layer's state, against state_bytes
        hello = self._start(params)
        name = hello.get("name")
        if not isinstance(name, str) or not name:
            raise SpecError(
                f"{path}:{class_name}: the scorer has no name; decorate it with @kvbench.policy('name')"
            )
        vars(self).update(
            name=name,
            needs=frozenset(hello["needs"]),
            evicts=bool(hello["evicts"]),
            layer_reduce=hello["layer_reduce"],
            description=str(hello.get("description") or name),
            source_sha256=hashlib.sha256(self.source).hexdigest(),
        )
        if not self.needs <= set(NEEDS) or self.layer_reduce not in ("none", "mean"):
            raise SpecError(
                f"{path}:{class_name}: the scorer declares needs {sorted(self.needs)} "
                f"and layer_reduce {self.layer_reduce!r}; known needs: {list(NEEDS)}"
            )
        refuse_builtin_name(name, f"{path}:{class_name}")
        self.window, self.recorded = int(hello["query_window"]), dict(hello["params"])
        self.shipped_documentation = {
            "name": name,
            "summary": str(hello.get("summary", "")),
            "module_doc": str(hello.get("module_doc", "")),
            "module": f"{self.file_name} (isolated scorer file)",
            "class": class_name,
            "source_sha256": self.source_sha256,
            "needs": sorted(self.needs),
        }

    def _start(self, params: dict[str, Any]) -> dict[str, Any]:
        label = f"{self.file_name}:{self.class_name}"
        self.served = False
        self.read: set[str] | None = None  # the view's tensors it has read; None: not known yet
        started = time.monotonic()
        try:
            self.process = _shared(self.source, self.class_name, label, self.limits)
            self.process.users += 1
            hello, _ = self.process.call(
                {"op": "hello", "params": params},
                {},
                f"scorer {label}",
                self.limits.seconds_per_call,
                "call (--scorer-seconds; loading the file and making the policy is one)",
            )
        except ScorerError as exc:  # it does not load: a problem of the file, named by its path here
            raise SpecError(str(exc).replace(f"{INSIDE}/scorer.py", self.path)) from None
        finally:
            self.spent += time.monotonic() - started
        self.instance = int(hello.get("instance", 0))
        return hello

    def _running(self) -> ScorerProcess:
        # unpickled in another process (a Ray worker), or the shared process ended before this policy's
        # first event (another run's scorer failed in it): an instance in a running process
        if self.process is None or (not self.served and not self.process.alive()):
            self.close()
            self._start(self.recorded)
        assert self.process is not None
        self.served = True
        return self.process

    def _call(
        self, request: wire.Frame, where: str, room: int, later: frozenset[str] = frozenset()
    ) -> wire.Frame:
        """One call, within the time limit per call and what is left of the run's (``seconds_per_run``),
        whichever ends first, named in the message when it is exceeded."""
        header, tensors = request
        run = self.limits.seconds_per_run
        left, seconds, per = run - self.spent, self.limits.seconds_per_call, "event"
        per_run = f"run ({run:g} s for all of one run's calls, --scorer-run-seconds)"
        if left <= 0:
            raise ScorerError(f"{where}: no time left of the time limit per {per_run}")
        if left < seconds:
            seconds, per = left, per_run
        started = time.monotonic()
        try:
            return self._running().call(
                {**header, "instance": self.instance}, tensors, where, seconds, per, later, room
            )
        finally:
            self.spent += time.monotonic() - started

    @property
    def query_window(self) -> int:
        return self.window

    def params(self) -> dict[str, Any]:
        return dict(self.recorded)

    def score(self, view: EvictionView) -> Tensor:
        where = f"policy {self.name!r} at layer {view.layer}, eviction event {view.event}"
        # the view's tensors this scorer has never read cross only if it reads them (a copy less per event)
        unread = frozenset(messages.ON_REQUEST) - self.read if self.read is not None else frozenset()
        request = messages.eviction_request(view)
        room = messages.reply_room(request[1], tuple(view.keys.shape[:3]))
        header, tensors = self._call(request, where, room, unread)
        read = header.get("read")
        if isinstance(read, list):
            self.read = (self.read or set()) | (set(map(str, read)) & set(messages.ON_REQUEST))
        if "scores" not in tensors:
            raise ScorerError(f"{where}: the scorer's process returned no scores")
        with _reading(where):
            _take_state(
                view.state, header, tensors, view.keys.shape[:2], where, self._holds(view.layer, where)
            )
            return tensors["scores"].to(view.keys.device)

    def observe(self, step: StepView) -> None:
        where = f"policy {self.name!r} observing layer {step.layer} at step {step.step}"
        request = messages.step_request(step)
        header, tensors = self._call(request, where, messages.reply_room(request[1]))
        with _reading(where):
            holds = self._holds(step.layer, where)
            _take_state(step.state, header, tensors, step.positions.shape[:2], where, holds)

    def _holds(self, layer: int, where: str) -> Callable[[int], None]:
        """What checks a layer's returned state of some bytes against the state all layers may hold."""

        def check(nbytes: int) -> None:
            others = sum(held for at, held in self.state_held.items() if at != layer)
            if others + nbytes > self.limits.state_bytes:
                bound = self.limits.state_bytes / 2**30
                raise ScorerError(
                    f"{where}: the scorer returned a layer state of {nbytes / 2**20:.1f} MiB, which with the "
                    f"other layers' {others / 2**20:.1f} MiB passes the {bound:g} GiB of state kvbench "
                    "keeps for one scorer"
                )
            self.state_held[layer] = nbytes

        return check

    def close(self) -> None:
        """Release this policy's instance; the process stops with the last one."""
        process, self.process = self.process, None
        if process is None:
            return
        process.users -= 1
        if process.users <= 0 or not process.alive():
            process.close()
            return
        with contextlib.suppress(ScorerError):
            process.call({"op": "drop", "instance": self.instance}, {}, "dropping an instance", 5.0)

    def __getstate__(self) -> dict[str, Any]:
        return {**vars(self), "process": None}


@contextlib.contextmanager
def _reading(where: str) -> Iterator[None]:
    """Reading a reply that came in whole: what fails here is this side's reading of a malformed reply (a
    state's fills that are not numbers, a missing field), not the scorer's code raising, and is named so."""
    try:
        yield
    except ScorerError:
        raise
    except Exception as exc:
        raise ScorerError(
            f"{where}: kvbench (the host) could not read the scorer's reply, whose header or tensors are "
            f"malformed: {type(exc).__name__}: {exc}"
        ) from None


def _take_state(
    state: LayerState,
    header: dict[str, Any],
    tensors: dict[str, Tensor],
    rows_heads: Any,
    where: str,
    holds: Callable[[int], None],
) -> None:
    """The scorer's layer state back, refused unless every tensor still lines up with the cache's slots and
    ``holds`` takes its bytes."""
    returned = messages.layer_state(header, tensors)
    new, old = returned.tensors(), state.tensors()
    holds(sum(t.numel() * t.element_size() for t in new.values()))
    batch, heads = int(rows_heads[0]), int(rows_heads[1])
    device = next(iter(old.values())).device if old else None
    for name, tensor in new.items():
        slot = name.startswith("slot.")
        fits = (
            tensor.dim() >= (3 if slot else 1)
            and tensor.shape[0] == batch
            and (not slot or tensor.shape[1] == heads)
        )
        if name in old and old[name].shape != tensor.shape:
            fits = False
        if not fits:
            raise ScorerError(
                f"{where}: the scorer returned layer state {name!r} of shape {tuple(tensor.shape)}, "
                f"which does not line up with the cache's [B={batch}, Hkv={heads}, S, ...]"
            )
    lengths = {t.shape[2] for n, t in new.items() if n.startswith("slot.")}
    if len(lengths) > 1:
        raise ScorerError(f"{where}: the scorer's slot state has different slot counts {sorted(lengths)}")
    state.replace({k: v.to(device) if device is not None else v for k, v in new.items()}, returned.fills())


def isolated(text: str, limits: IsolationLimits = IsolationLimits()) -> Policy:
    """``--policy FILE.py:Class[:k=v,...]`` run in its own process; any other policy text is refused."""
    path, class_name, raw = parse_policy_arg(text)
    if class_name is None:
        raise SpecError(f"--isolate runs a scorer from a file (path/to/file.py:Class); {text!r} is not one")
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise SpecError(f"--policy {text}: no file {file}")
    return IsolatedPolicy(file, class_name, raw, limits)

"""The parent's side of an isolated scorer: its process behind the boundary, and a Policy that asks it.

The scorer's file is copied into a folder of its own and imported only inside the child process, which
runs under bubblewrap as the code grader's programs do (kvbench.graders.sandbox): fresh namespaces with
no network, the system, this Python and kvbench's own code read-only, a small tmpfs as the only writable
place, nothing else of this machine (no results, no task data, no home, no caches). The child sees what
the policy contract gives at each event and returns scores and its own layer state, which are checked
before the engine uses them; every call has a time limit. Decoding, the null, the full cache, graders
and the store stay in the parent, which never imports the scorer.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import resource
import selectors
import shutil
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from kvbench.core.contract import NEEDS, EvictionView, LayerState, Policy, StepView
from kvbench.errors import ScorerError, SpecError
from kvbench.graders.sandbox import Sandbox, boundary, kill, launch, program_folder, rlimits
from kvbench.isolation import messages, wire
from kvbench.registry import parse_policy_arg, refuse_builtin_name

INSIDE = "/scorer"


@dataclass(frozen=True)
class IsolationLimits:
    seconds_per_call: float = 60.0
    """The time limit of one event (a score or an observed step)."""
    start_seconds: float = 180.0
    """Starting the process: importing torch and the scorer's file."""
    memory_bytes: int = 16 << 30
    """Address space of the scorer's process (torch reserves much more than it touches)."""
    scratch_bytes: int = 64 << 20
    reply_bytes: int = 1 << 32
    log_bytes: int = 64 << 10
    """The last bytes of the scorer's stderr kept, for the message when it fails."""


def _command(bwrap: str, folder: Path, class_name: str, limits: IsolationLimits) -> list[str]:
    import kvbench.adapters
    import kvbench.policies

    python = Path(sys.executable)
    # kvbench's code on this machine: the package and the folders mapped into it (policies, adapters)
    packages = {Path(m.__file__).resolve().parent for m in (kvbench, kvbench.policies, kvbench.adapters)}  # type: ignore[arg-type]
    code = dict.fromkeys(str(p) for p in (Path(sys.prefix).resolve(), *sorted(packages)))
    folders = [(path, path) for path in code] + [(str(folder), INSIDE)]
    environment = {"OMP_NUM_THREADS": "1"}
    inside = boundary(
        bwrap, python.resolve(), folders, limits.scratch_bytes, environment, read_only_root=True
    )
    return [*inside, str(python), "-I", "-m", "kvbench.isolation.child", f"{INSIDE}/scorer.py", class_name]


class ScorerProcess:
    """One scorer's process: a request, then its reply within the time limit, in turn."""

    def __init__(self, source: bytes, class_name: str, label: str, limits: IsolationLimits) -> None:
        sandbox = Sandbox()
        sandbox.check()
        self.label, self.limits = label, limits
        self.folder = program_folder("kvbench-scorer-", {"scorer.py": source})
        self.process = launch(
            _command(str(sandbox.bwrap), self.folder, class_name, limits),
            rlimits({resource.RLIMIT_AS: limits.memory_bytes, resource.RLIMIT_CORE: 0}),
        )
        assert self.process.stdin and self.process.stdout and self.process.stderr
        self.log: collections.deque[bytes] = collections.deque()
        threading.Thread(target=self._drain, args=(self.process.stderr,), daemon=True).start()
        self.pipes = _Pipes(self.process.stdin.fileno(), self.process.stdout.fileno())
        self._finalizer = weakref.finalize(self, _stop, self.process, self.folder, self.pipes)

    def _drain(self, stream: Any) -> None:
        size = 0
        for chunk in iter(lambda: stream.read1(1 << 14), b""):
            self.log.append(chunk)
            size += len(chunk)
            while size > self.limits.log_bytes and len(self.log) > 1:
                size -= len(self.log.popleft())

    def call(
        self, header: dict[str, Any], tensors: dict[str, Tensor], where: str, seconds: float
    ) -> wire.Frame:
        """The reply to one request; ScorerError naming ``where`` when the scorer fails, dies or is late."""
        if self.process.poll() is not None:
            raise ScorerError(f"{where}: the scorer's process is no longer running ({self._exit()})")
        self.pipes.deadline = time.monotonic() + seconds
        try:
            self.pipes.write(wire.encode(header, tensors))
            header, tensors = wire.read(self.pipes, self.limits.reply_bytes)
        except TimeoutError:
            self.close()
            raise ScorerError(
                f"{where}: no answer within {seconds:g} s, the time limit per event; the scorer's process "
                "was stopped (a scorer must return from every call)"
            ) from None
        except (wire.WireError, OSError, ValueError) as exc:
            self.close()
            raise ScorerError(f"{where}: the scorer's process broke off ({self._exit()}; {exc})") from None
        if not header.get("ok"):
            name, message = header.get("error", "an error"), header.get("message", "")
            detail = str(header.get("trace", "")).strip().splitlines()[-6:]
            raise ScorerError(f"{where} raised {name}: {message}\n" + "\n".join(detail))
        return header, tensors

    def _exit(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=2)
        status = self.process.returncode
        tail = b"".join(self.log).decode(errors="replace").strip().splitlines()[-5:]
        said = f"; its last words: {' | '.join(tail)}" if tail else ""
        return f"exit status {status}{said}"

    def close(self) -> None:
        self._finalizer()


def _stop(process: subprocess.Popen, folder: Path, pipes: _Pipes) -> None:
    kill(process)
    pipes.close()
    shutil.rmtree(folder, ignore_errors=True)


class _Pipes:
    """The scorer's stdin and stdout: ``write(data)`` and a file-like ``read(n)``, each raising TimeoutError
    past ``deadline``. Each pipe has one selector for the process's life: an event's request and reply
    cross in many pipe-sized chunks, and a selector per chunk would cost system calls on every one."""

    def __init__(self, stdin: int, stdout: int) -> None:
        self.stdin, self.stdout, self.deadline = stdin, stdout, 0.0
        self.readable, self.writable = selectors.DefaultSelector(), selectors.DefaultSelector()
        for fd, selector, event in ((stdout, self.readable, selectors.EVENT_READ),
                                    (stdin, self.writable, selectors.EVENT_WRITE)):  # fmt: skip
            os.set_blocking(fd, False)
            selector.register(fd, event)

    def read(self, count: int) -> bytes:
        self._wait(self.readable)
        return os.read(self.stdout, min(count, 1 << 24))

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._wait(self.writable)
            try:
                view = view[os.write(self.stdin, view) :]
            except BlockingIOError:
                continue

    def _wait(self, selector: selectors.BaseSelector) -> None:
        """Return once the selector's pipe is ready; TimeoutError past ``deadline``."""
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if selector.select(timeout=min(remaining, 1.0)):
                return

    def close(self) -> None:
        self.readable.close()
        self.writable.close()


class IsolatedPolicy(Policy):
    """A scorer from a file, run in its own process behind the boundary; the engine sees a Policy."""

    def __init__(
        self, path: Path, class_name: str, params: dict[str, Any], limits: IsolationLimits = IsolationLimits()
    ) -> None:
        self.source = Path(path).read_bytes()
        self.class_name, self.limits = class_name, limits
        self.file_name, self.path = Path(path).name, str(path)
        self.process: ScorerProcess | None = None
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
        self.process = ScorerProcess(self.source, self.class_name, label, self.limits)
        try:
            hello, _ = self.process.call(
                {"op": "hello", "params": params}, {}, f"scorer {label}", self.limits.start_seconds
            )
        except ScorerError as exc:  # it does not load: a problem of the file, named by its path here
            raise SpecError(str(exc).replace(f"{INSIDE}/scorer.py", self.path)) from None
        return hello

    def _running(self) -> ScorerProcess:
        if self.process is None:  # unpickled in another process (a Ray worker): start it there
            self._start(self.recorded)
        assert self.process is not None
        return self.process

    @property
    def query_window(self) -> int:
        return self.window

    def params(self) -> dict[str, Any]:
        return dict(self.recorded)

    def score(self, view: EvictionView) -> Tensor:
        where = f"policy {self.name!r} at layer {view.layer}, eviction event {view.event}"
        header, tensors = self._running().call(
            *messages.eviction_request(view), where, self.limits.seconds_per_call
        )
        if "scores" not in tensors:
            raise ScorerError(f"{where}: the scorer's process returned no scores")
        _take_state(view.state, header, tensors, view.keys.shape[:2], where)
        return tensors["scores"].to(view.keys.device)

    def observe(self, step: StepView) -> None:
        where = f"policy {self.name!r} observing layer {step.layer} at step {step.step}"
        header, tensors = self._running().call(
            *messages.step_request(step), where, self.limits.seconds_per_call
        )
        _take_state(step.state, header, tensors, step.positions.shape[:2], where)

    def close(self) -> None:
        if self.process is not None:
            self.process.close()

    def __getstate__(self) -> dict[str, Any]:
        return {**vars(self), "process": None}


def _take_state(
    state: LayerState, header: dict[str, Any], tensors: dict[str, Tensor], rows_heads: Any, where: str
) -> None:
    """The scorer's layer state back, refused unless every tensor still lines up with the cache's slots."""
    returned = messages.layer_state(header, tensors)
    new, old = returned.tensors(), state.tensors()
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


def isolated(text: str, limits: IsolationLimits = IsolationLimits(), **params: Any) -> Policy:
    """``--policy FILE.py:Class[:k=v,...]`` run in its own process; any other policy text is refused."""
    path, class_name, raw = parse_policy_arg(text)
    if class_name is None:
        raise SpecError(f"--isolate runs a scorer from a file (path/to/file.py:Class); {text!r} is not one")
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise SpecError(f"--policy {text}: no file {file}")
    return IsolatedPolicy(file, class_name, {**raw, **params}, limits)

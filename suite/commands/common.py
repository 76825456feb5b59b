"""What several subcommands share: arguments, so that each maps to one field the same way everywhere, and
the console, which prints text from a scorer or a bundle as text (printable())."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook
from rich.segment import Segment
from rich.table import Table

from kvbench.errors import StorageError
from kvbench.printable import printable

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from kvbench.runner.executor import Executor
Request = TypeVar("Request", bound="DataclassInstance")


class _Escaped:
    """A renderable whose text segments are printable(): what reaches the terminal from kvbench's consoles
    has no control character but rich's own (styles, and the cursor moves of a live display)."""

    def __init__(self, renderable: ConsoleRenderable) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        for segment in console.render(self.renderable, options):
            yield segment if segment.control else segment._replace(text=printable(segment.text, lines=True))


class _EscapeHook(RenderHook):
    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_Escaped(r) for r in renderables]


def text_console(**settings: Any) -> Console:
    """A Console that prints text as it is: no Rich markup or emoji codes (a name with "[/]" or ":smile:"
    in it is that text; style goes through rich.text.Text) and no control characters (printable(), as a
    last guard: call printable() on text from a scorer or a bundle before a table measures it)."""
    made = Console(markup=False, emoji=False, **settings)
    made.push_render_hook(_EscapeHook())
    return made


# Piped output is not wrapped at 80 columns: tables stay readable in logs and CI.
console = text_console(width=None if sys.stdout.isatty() else 160)


def output_folder(folder: Path, flag: str) -> None:
    """``folder`` checked writable before any work is done (or, while it does not exist, the folder it
    would be made in), so that a results folder that cannot take a file fails now, naming its flag, and
    not after the run; a command refused before it starts leaves no folder behind."""
    existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
    _writable(existing, flag, folder, make=False)


def output_file(path: Path, flag: str) -> None:
    """``path``'s folder made if missing and checked writable before any work is done (as output_folder)."""
    _writable(path.parent, flag, path)


def _writable(folder: Path, flag: str, given: Path, make: bool = True) -> None:
    try:
        if make:
            folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise StorageError(
            f"{flag} {given}: cannot write in {folder} ({exc.strerror or exc}); give a path you can write to"
        ) from exc


def measured_table(title: str | None, columns: Sequence[str]) -> Table:
    """A table of measurements: what was measured (the first column) to the left, the numbers to the
    right."""
    table = Table(title=title)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    return table


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def from_flags(kind: type[Request], args: argparse.Namespace, **given: Any) -> Request:
    """A ``kind`` (a dataclass) with each field from the flag of its name, those in ``given`` aside."""
    return kind(**given, **{f.name: getattr(args, f.name) for f in fields(kind) if f.name not in given})


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the units of work run: this process, or a Ray cluster (`run`, and `verify`'s
    re-computation)."""
    ray = parser.add_argument_group("executor (where the units of work run)")
    ray.add_argument(
        "--executor", choices=["local", "ray"], default="local", help="local (this process) or a Ray cluster"
    )
    ray.add_argument("--address", help="Ray: the cluster's address (default: start one on this machine)")
    ray.add_argument("--ray-workers", type=int, help="Ray: model replicas (default: what the cluster holds)")
    ray.add_argument(
        "--ray-cpus-per-worker",
        type=float,
        help="Ray, CPU: CPUs (torch threads) per replica (default: a node's CPU count)",
    )
    ray.add_argument("--ray-gpus-per-worker", type=int, default=1, help="Ray, CUDA: GPUs per replica")
    ray.add_argument(
        "--ray-results",
        choices=["shared", "driver"],
        default="shared",
        help="Ray: replicas write shards into the results folder, which every node reaches (shared), or "
        "return rows",
    )


def executor_from(args: argparse.Namespace, out: Path) -> Executor | None:
    """The executor the flags of :func:`add_executor_arguments` name (None: this process)."""
    if args.executor != "ray":
        return None
    from kvbench.runner.ray_executor import RayExecutor, RayOptions

    options = RayOptions(
        address=args.address,
        workers=args.ray_workers,
        cpus_per_worker=args.ray_cpus_per_worker,
        gpus_per_worker=args.ray_gpus_per_worker,
        results=args.ray_results,
    )
    return RayExecutor(out, options)


def add_scorer_memory_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scorer-memory",
        type=float,
        default=4.0,
        metavar="GIB",
        help="an isolated scorer: the memory its processes may hold resident, all together, each shared page "
        "counted once (default: 4 GiB; each process also has 16 GiB of address space)",
    )


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=int,
        help="torch's CPU threads (default: torch's, one per core). On a machine busy with other work, "
        "--threads 1 can be several times faster; the count is recorded with the results",
    )


def busy_machine_hint(
    threads: int | None, device: str, *, load: float | None = None, cores: int | None = None
) -> str | None:
    """A line suggesting ``--threads`` when other work holds at least one of the cores torch's threads
    would use: its threads wait on each other at every operation, so one busy core slows them all (2.8
    times on 2 cores, docs/running.md). None when ``--threads`` is given or the work is not on the CPU.
    ``load`` (default: the 1-minute load average, read before the model loads, so mostly others' work) and
    ``cores`` (default: the CPU count) are parameters for the tests."""
    if threads is not None or not device.startswith("cpu"):
        return None
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # not on Windows, nor where the kernel does not say
            return None
    cores = cores or os.cpu_count() or 1
    import torch

    ours = torch.get_num_threads()
    if load < cores - ours + 1:
        return None
    return (
        f"the machine is busy (load {load:.1f} on {cores} cores): `--threads {max(1, int(cores - load))}` "
        "can be several times faster here (docs/running.md#on-a-busy-machine)"
    )


SHORT_SPIN = "1000"
"""GOMP_SPINCOUNT kvbench gives torch's OpenMP threads on a busy machine: an idle thread spins this many
times, then sleeps. libgomp's default (300,000 spins) holds a core while its thread waits for the next
parallel region; on a busy machine torch's threads then spin against the other work and each other.
Measured on the 2-core development machine (AMD EPYC), `kvbench run --model smollm2-135m --task fidelity
--limit 1 --policy snapkv` (3 units), seconds of scoring: quiet 19.9 and 20.5 with libgomp's spin, 23.4 and
25.1 with the short one; under 4 CPU burners (a load of twice the cores) 231 with libgomp's, 79 with the
short one (docs/running.md#on-a-busy-machine). So the short spin is for a machine busy at start."""

QUIET_SPIN = "30000"
"""GOMP_SPINCOUNT kvbench gives torch's threads on a machine quiet at start: a tenth of libgomp's default.
libgomp reads it once, so it must also serve a machine that becomes busy mid-run. Measured on the 2-core
development machine (AMD EPYC), the same 3-unit job, seconds of wall time: quiet 27.7 and 27.4 with it,
29.7 and 29.0 with libgomp's 300,000, 33.7 and 33.6 with the short spin; under 4 CPU burners 148 with it,
242 with libgomp's, 102 with the short spin. Quiet it is as fast as libgomp's default; busy, 1.6 times
faster."""


def sleep_when_idle(load: float | None = None, cores: int | None = None) -> None:
    """Give torch's OpenMP threads a spin chosen from the load at start, before torch is loaded (libgomp
    reads it once), unless the user set how OpenMP threads wait: the short spin on a machine busy at start
    (a 1-minute load average of at least 1: other work holds a core torch's threads, one per core, would
    use), else QUIET_SPIN. The wait changes no arithmetic,
    only when an idle thread gives its core back. ``load`` and ``cores`` are parameters for the tests."""
    if "torch" in sys.modules:  # too late: its OpenMP read the environment when it loaded
        return
    if "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        return
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # not on Windows, nor where the kernel does not say
            return
    cores = cores or os.cpu_count() or 1
    os.environ[_LOAD_AT_START] = f"{load:.1f} on {cores} cores"
    os.environ["GOMP_SPINCOUNT"] = spin_for(load)


def spin_for(load: float) -> str:
    """The spin a run starting at this 1-minute load average gives torch's threads."""
    return SHORT_SPIN if load >= 1.0 else QUIET_SPIN


_LOAD_AT_START = "KVBENCH_LOAD_AT_START"
"""Where the load that chose the spin is kept for the run's line (and a child process's)."""


def waiting() -> str:
    """How torch's idle OpenMP threads wait in this process, as a run states it."""
    spin, load = os.environ.get("GOMP_SPINCOUNT"), os.environ.get(_LOAD_AT_START)
    if os.environ.get("OMP_WAIT_POLICY"):
        return f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']} (yours)"
    if spin == SHORT_SPIN and load:
        short = f"an idle thread sleeps after a short spin (GOMP_SPINCOUNT={spin})"
        return f"busy at start (load {load}): {short}"
    if spin == QUIET_SPIN and load:
        tenth = f"an idle thread sleeps after a tenth of libgomp's spin (GOMP_SPINCOUNT={spin})"
        return f"quiet at start (load {load}): {tenth}, as fast quiet and faster if the machine gets busy"
    if spin:
        return f"GOMP_SPINCOUNT={spin} (yours)"
    return "libgomp's default spin"


def warn_if_busy(threads: int | None, device: str) -> None:
    """The threads and how they wait, then busy_machine_hint's line where it has one and threads still
    spin long: on stdout with the run's progress, since stderr is the one line of a command's failure."""
    if not device.startswith("cpu"):
        return
    import torch

    console.print(f"torch: {torch.get_num_threads()} thread(s); {waiting()}", highlight=False)
    hint = busy_machine_hint(threads, device)
    if hint and os.environ.get("GOMP_SPINCOUNT") != SHORT_SPIN:
        console.print(hint)


def use_threads(threads: int | None) -> None:
    """Set torch's intra-op threads before any model loads. Float reductions depend on the count, so it is
    recorded in every run's provenance (``torch_threads``) and `kvbench check` compares it."""
    if threads is None:
        return
    if threads < 1:
        from kvbench.errors import SpecError

        raise SpecError(f"--threads {threads}: give at least 1")
    import torch

    torch.set_num_threads(threads)

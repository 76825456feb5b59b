"""Arguments that several subcommands share, so that each maps to one field the same way everywhere."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from kvbench.errors import StorageError

# Piped output is not wrapped at 80 columns: tables stay readable in logs and CI. Text is printed as it
# is: a policy name, a path or a message with "[/]" or ":smile:" in it is neither Rich markup nor an
# emoji code (style goes through rich.text.Text).
console = Console(width=None if sys.stdout.isatty() else 160, markup=False, emoji=False)


def output_folder(folder: Path, flag: str) -> Path:
    """``folder`` checked writable before any work is done (or, while it does not exist, the folder it
    would be made in), so that a results folder that cannot take a file fails now, naming its flag, and
    not after the run; a command refused before it starts leaves no folder behind."""
    existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
    _writable(existing, flag, folder, make=False)
    return folder


def output_file(path: Path, flag: str) -> Path:
    """``path``'s folder made if missing and checked writable before any work is done (as output_folder)."""
    _writable(path.parent, flag, path)
    return path


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


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


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


def warn_if_busy(threads: int | None, device: str) -> None:
    """busy_machine_hint's line, where it has one: on stdout with the run's progress, since stderr is the
    one line of a command's failure."""
    hint = busy_machine_hint(threads, device)
    if hint:
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

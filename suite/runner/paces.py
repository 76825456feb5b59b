"""How long units took on this machine, kept between runs, so that a run can say before its first token
how long it will take (kvbench.runner.eta reads them as its prior).

A pace is kept per machine (CPU, cores, device, torch's threads), model and unit kind (task, and whether
the arm evicts): the seconds, units and tokens (Unit.cost) of the units computed so far, in one JSON file
in kvbench's cache folder. A machine busy with other work records slower paces; the estimate says where it
comes from, and the run's own finished units replace it as they come.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
from pathlib import Path
from typing import Any

from kvbench.cache_folder import cache_root

KEPT_UNITS = 200
"""The newest units kept per kind: a pace follows the machine and kvbench as they change."""


def machine_key(device: str) -> str:
    import torch

    from kvbench.provenance import describe_machine

    machine = describe_machine(device)
    return f"{machine['cpu']} ×{machine['cpu_count']} {device} {torch.get_num_threads()} threads"


def _path() -> Path:
    return cache_root() / "paces.json"


def _read() -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        held = json.loads(_path().read_text())
        if isinstance(held, dict):
            return held
    return {}


def stored(machine: str, model: str) -> dict[tuple[str, bool], tuple[float, float]]:
    """(task, evicts) → (seconds, tokens) of a typical unit kept: the median seconds per token times the
    mean tokens (the median seconds where units have no tokens), so that the units of a run on a busy
    machine do not set the pace of every later one. Empty where none ran here."""
    kinds = _read().get(machine, {}).get(model, {})
    found = {}
    for key, units in kinds.items():
        task, _, evicts = key.rpartition("/")
        with contextlib.suppress(TypeError, ValueError, statistics.StatisticsError):
            pairs = [(float(s), float(t)) for s, t in units]
            tokens = statistics.fmean(t for _, t in pairs)
            if tokens > 0 and all(t > 0 for _, t in pairs):
                seconds = statistics.median(s / t for s, t in pairs) * tokens
            else:
                seconds = statistics.median(s for s, _ in pairs)
            if seconds > 0:
                found[task, evicts == "evicts"] = (seconds, tokens)
    return found


def record(machine: str, model: str, finished: list[tuple[str, bool, float, float]]) -> None:
    """Add ``finished`` units (task, evicts, seconds, tokens) to the file; a file that cannot be written
    costs the next run its estimate, never this run its results."""
    if not finished:
        return
    held = _read()
    kinds = held.setdefault(machine, {}).setdefault(model, {})
    for task, evicts, seconds, tokens in finished:
        units = kinds.setdefault(f"{task}/{'evicts' if evicts else 'full'}", [])
        units.append([round(seconds, 3), tokens])
        del units[:-KEPT_UNITS]
    path = _path()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(held))
        temporary.replace(path)

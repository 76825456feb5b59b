"""Every cell against what its adapter provides, once, before any model loads."""

from __future__ import annotations

from kvbench.adapters.base import find_adapter
from kvbench.errors import CapabilityError
from kvbench.runner.cell import Cell
from kvbench.runner.sources import task_source


def check_capabilities(cells: list[Cell]) -> None:
    """Every cell against what its adapter provides, once, before any model loads: one error naming all
    that cannot run."""
    problems: list[str] = []
    for runtime in dict.fromkeys(c.runtime for c in cells):
        adapter = find_adapter(runtime.adapter)
        can = adapter.capabilities()
        here = [c for c in cells if c.runtime == runtime]
        wanted: dict[str, tuple[set[str], tuple[str, ...]]] = {
            "device": ({runtime.device_kind}, can.devices),
            "attention": ({runtime.attention}, can.attentions),
            "dtype": ({c.model.dtype for c in here}, can.dtypes),
        }
        for what, (asked, provided) in wanted.items():
            offered = ", ".join(provided)
            for value in sorted(asked - set(provided)):
                problems.append(f"{what} {value!r}: the {adapter.name} adapter provides {offered}")
        for task in dict.fromkeys(c.task.name for c in here if task_source(c.task).teacher_forced):
            if not can.teacher_forcing:
                problems.append(
                    f"task {task!r} is a teacher-forced probe, which the {adapter.name} adapter cannot run"
                )
        for policy in dict.fromkeys(c.policy.name for c in here):
            needs = next(c.policy.needs for c in here if c.policy.name == policy)
            if needs - can.needs:
                missing = ", ".join(sorted(needs - can.needs))
                problems.append(f"policy {policy!r} needs {missing}, which the {adapter.name} adapter lacks")
        for protocol in dict.fromkeys(c.protocol.name for c in here if c.protocol.precision is not None):
            if not can.mixed_precision:
                problems.append(
                    f"protocol {protocol!r} keeps a mixed-precision cache, which the {adapter.name} adapter "
                    "cannot (the hf adapter can)"
                )
    if problems:
        raise CapabilityError("these cells cannot run as asked:\n  " + "\n  ".join(problems))

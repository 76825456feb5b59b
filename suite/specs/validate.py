"""``kvbench validate``: load every spec (and what it refers to) without running anything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError, SpecError
from kvbench.registry import make_policy
from kvbench.specs.loading import load_spec
from kvbench.specs.model import ModelSpec, load_model_spec, model_names
from kvbench.specs.protocol import ProtocolSpec, load_protocol, protocol_names
from kvbench.specs.suite import SuiteSpec, load_suite, suite_names
from kvbench.specs.task import TaskSpec, load_task, task_names

KINDS: dict[str, type[ModelSpec | ProtocolSpec | SuiteSpec | TaskSpec]] = {
    "models": ModelSpec,
    "protocols": ProtocolSpec,
    "suites": SuiteSpec,
    "tasks": TaskSpec,
}


def _check_suite(suite: SuiteSpec) -> None:
    """A suite's references resolve: models, tasks, policies, protocol (with sampling for each family)."""
    protocol = load_protocol(suite.protocol)
    _check_protocol(protocol)
    for model in suite.models:
        family = load_model_spec(model).family
        if family not in protocol.sampling:
            raise SpecError(
                f"suite {suite.name!r}: protocol {protocol.name!r} has no sampling for {family!r}"
            )
    for task in suite.tasks:
        load_task(task)
    for policy in suite.policies:
        make_policy(policy)


def _check_protocol(protocol: ProtocolSpec) -> None:
    """A protocol's null baseline and reference name policies that exist."""
    for field in ("baseline", "reference"):
        try:
            make_policy(getattr(protocol, field))
        except KvbenchError as exc:
            raise SpecError(f"protocol {protocol.name!r}, field `{field}`: {exc}") from None


def _kind_of(path: Path) -> str:
    for part in reversed(path.resolve().parts[:-1]):
        if part in KINDS:
            return part
    raise SpecError(
        f"{path}: cannot tell which kind of spec this is; keep it in a folder named "
        f"{', '.join(KINDS)} (as in the project layout)"
    )


def validate_paths(
    path: Path | None, check_task: Callable[[TaskSpec], Any] = lambda task: task
) -> list[tuple[str, str]]:
    """Every spec (under ``path``, or every known one) loaded and checked; ``check_task`` also checks each
    task file with what its source loads (the caller's: lm-eval's tasks are above the specs)."""
    checked: list[tuple[str, str]] = []
    if path is None:
        for name in model_names():
            checked.append(("model", load_model_spec(name).name))
        for name in protocol_names():
            protocol = load_protocol(name)
            _check_protocol(protocol)
            checked.append(("protocol", protocol.name))
        for name in task_names():
            checked.append(("task", load_task(name).name))
        for name in suite_names():
            suite = load_suite(name)
            _check_suite(suite)
            checked.append(("suite", suite.name))
        return checked
    files = sorted(path.rglob("*.yaml")) if path.is_dir() else [path]
    if not files:
        raise SpecError(f"{path}: no .yaml file to validate")
    for file in files:
        kind = _kind_of(file)
        spec: ModelSpec | ProtocolSpec | SuiteSpec | TaskSpec = (
            load_task(file) if kind == "tasks" else load_spec(file, KINDS[kind])
        )
        if isinstance(spec, TaskSpec):
            check_task(spec)  # an lm-eval task loads, and kvbench can score it (metric, filter, documents)
        if isinstance(spec, SuiteSpec):
            _check_suite(spec)
        if isinstance(spec, ProtocolSpec):
            _check_protocol(spec)
        checked.append((kind.rstrip("s"), spec.name))
    return checked

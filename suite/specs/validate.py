"""``kvbench validate``: load every spec (and what it refers to) without running anything."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain
from pathlib import Path
from typing import Any, TypeAlias

from kvbench.errors import KvbenchError, SpecError
from kvbench.registry import make_policy
from kvbench.specs.loading import load_spec, parse_yaml
from kvbench.specs.model import ModelSpec, load_model_spec, model_names
from kvbench.specs.protocol import ProtocolSpec, load_protocol, protocol_names
from kvbench.specs.suite import SuiteSpec, load_suite, suite_names
from kvbench.specs.task import TaskSpec, load_task, task_names

Spec: TypeAlias = ModelSpec | ProtocolSpec | SuiteSpec | TaskSpec
KINDS: dict[str, type[Spec]] = {
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


def _own_fields(kind: str) -> list[str]:
    """The top-level fields of ``kind`` that no other kind of spec has: what tells a file's kind."""
    others = {field for other, cls in KINDS.items() if other != kind for field in cls.model_fields}
    return [field for field in KINDS[kind].model_fields if field not in others]


def _by_content(path: Path) -> str | None:
    """The kind whose own fields the file uses most, or None where no kind (or more than one) leads."""
    data = parse_yaml(path)
    if not isinstance(data, dict):
        return None
    counts = {kind: sum(field in data for field in _own_fields(kind)) for kind in KINDS}
    best = max(counts.values())
    leaders = [kind for kind, count in counts.items() if count == best]
    return leaders[0] if best > 0 and len(leaders) == 1 else None


def _kind_hint() -> str:
    """How each kind is told apart: its required fields that no other kind has."""
    parts = []
    for kind, cls in KINDS.items():
        required = [f"`{f}`" for f in _own_fields(kind) if cls.model_fields[f].is_required()]
        parts.append(f"a {kind.rstrip('s')} spec has {', '.join(required)}")
    return "; ".join(parts)


def _load(path: Path) -> Spec:
    """A spec file, as the kind its fields name (a kind's own fields, such as a model's `family`), or
    where they do not tell, as the kind its folder names (models/, protocols/, suites/, tasks/)."""
    kind = _by_content(path) or next((p for p in reversed(path.resolve().parts[:-1]) if p in KINDS), None)
    if kind is None:
        raise SpecError(
            f"{path}: cannot tell which kind of spec this is from its fields ({_kind_hint()}): add the "
            f"fields of its kind, or keep it in a folder named {', '.join(f'{k}/' for k in KINDS)}"
        )
    return load_task(path) if kind == "tasks" else load_spec(path, KINDS[kind])


def _checked(spec: Spec, check_task: Callable[[TaskSpec], Any]) -> tuple[str, str]:
    """(kind, name) of a loaded spec, once what it refers to resolves."""
    if isinstance(spec, TaskSpec):
        check_task(spec)  # an lm-eval task loads, and kvbench can score it (metric, filter, documents)
    if isinstance(spec, SuiteSpec):
        _check_suite(spec)
    if isinstance(spec, ProtocolSpec):
        _check_protocol(spec)
    return next(kind for kind, cls in KINDS.items() if isinstance(spec, cls)).rstrip("s"), spec.name


def validate_paths(
    path: Path | None, check_task: Callable[[TaskSpec], Any] = lambda task: task
) -> list[tuple[str, str]]:
    """Every spec (under ``path``, or every known one) loaded and checked; ``check_task`` also checks each
    task file with what its source loads (the caller's: lm-eval's tasks are above the specs)."""
    if path is None:  # each built-in loaded (lazily: one at a time) and checked, kind by kind
        builtin: Iterator[Spec] = chain(
            map(load_model_spec, model_names()),
            map(load_protocol, protocol_names()),
            map(load_task, task_names()),
            map(load_suite, suite_names()),
        )
        return [_checked(spec, lambda task: task) for spec in builtin]
    files = sorted(path.rglob("*.yaml")) if path.is_dir() else [path]
    if not files:
        raise SpecError(f"{path}: no .yaml file to validate")
    return [_checked(_load(file), check_task) for file in files]

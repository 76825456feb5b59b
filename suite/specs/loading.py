"""Loading YAML specs into strict pydantic models, with errors that name the file, the field and the fix."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml
from pydantic_core import ErrorDetails

from kvbench.errors import SpecError, UnknownNameError

SPEC_ROOT = Path(__file__).parent.parent
"""The package folder holding the built-in specs: models/, protocols/, suites/ (tasks/ is kvbench.tasks)."""
M = TypeVar("M", bound=pydantic.BaseModel)


class StrictSpec(pydantic.BaseModel):
    """Base of every spec: unknown fields are errors and a loaded spec never changes."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


def _field(error: ErrorDetails) -> str:
    return ".".join(str(part) for part in error["loc"]) or "(top level)"


_FIXES = {"missing": "add this field", "extra_forbidden": "remove it or correct its spelling"}
"""What to do about a validation error, by its type (otherwise: correct its value)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key that appears twice in one mapping (YAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # the base loader names an unhashable key itself
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice in one mapping (first at line {seen[key].line + 1}); "
                    "keep one of them",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def parse_yaml(path: Path) -> Any:
    """The YAML document in ``path`` (safe tags only, unique keys); problems raise SpecError naming it."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): "
            "save the file as UTF-8"
        ) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: safe tags only
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise SpecError(f"{path}: not valid YAML{line}: {getattr(exc, 'problem', exc)}") from None


def load_spec(path: Path, model: type[M]) -> M:
    """Parse and validate ``path`` as ``model``; any problem raises SpecError naming the file and field."""
    data = parse_yaml(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of fields at the top level, found {type(data).__name__}")
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = [
            f"  field `{_field(err)}`: {err['msg']} ({_FIXES.get(err['type'], 'correct its value')})"
            for err in exc.errors()
        ]
        raise SpecError(
            f"{path}: {len(problems)} problem(s) in this {model.__name__}:\n" + "\n".join(problems)
        ) from None


def with_overrides(spec: M, updates: Mapping[str, Any], flags: Mapping[str, str]) -> M:
    """``spec`` with command-line ``updates`` applied, validated by the same rules as its YAML fields.

    ``flags`` names the flag behind each updated field, so that an error says which flag to correct.
    """
    if not updates:
        return spec
    return validate_values(type(spec), {**spec.model_dump(), **updates}, flags, updates)


def validate_values(
    model: type[M], data: Mapping[str, Any], flags: Mapping[str, str], given: Mapping[str, Any]
) -> M:
    """``model`` validated from ``data``; an error names the flag (and value) the bad field came from."""
    try:
        return model.model_validate(dict(data))
    except pydantic.ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            flag = flags.get(field)
            where = f"{flag} {given[field]!r}" if flag else f"{model.__name__} field `{_field(err)}`"
            problems.append(
                f"{where}: {err['msg']} (the same rule as the {model.__name__} field `{_field(err)}`)"
            )
        raise SpecError("; ".join(problems)) from None


def spec_folder(folder: str) -> Path:
    """Where the built-in specs of ``folder`` are: ``suite/<folder>/``, the tasks in kvbench.tasks."""
    return Path(str(files("kvbench.tasks"))) if folder == "tasks" else SPEC_ROOT / folder


def spec_names(folder: str) -> list[str]:
    """Names of the built-in specs in ``folder`` (file stems)."""
    return sorted(p.stem for p in spec_folder(folder).glob("*.yaml"))


def find_spec_file(kind: str, folder: str, name_or_path: str) -> Path:
    """A built-in spec by name, or a user's YAML file by path."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml"):
        if not candidate.is_file():
            raise SpecError(f"{kind} spec file {candidate} does not exist")
        return candidate
    path = spec_folder(folder) / f"{name_or_path}.yaml"
    if not path.is_file():
        raise UnknownNameError(kind, name_or_path, spec_names(folder))
    return path

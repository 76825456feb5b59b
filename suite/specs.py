"""Loading YAML specs into strict pydantic models, with errors that name the file, the field and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import pydantic
import yaml

from kvbench.errors import SpecError, UnknownNameError

SPEC_ROOT = Path(__file__).parent
M = TypeVar("M", bound=pydantic.BaseModel)


class StrictSpec(pydantic.BaseModel):
    """Base of every spec: unknown fields are errors and a loaded spec never changes."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


def _field(error: dict) -> str:
    return ".".join(str(part) for part in error["loc"]) or "(top level)"


def _fix_for(error: dict) -> str:
    kind = error["type"]
    if kind == "missing":
        return "add this field"
    if kind == "extra_forbidden":
        return "remove it or correct its spelling"
    return "correct its value"


def load_spec(path: Path, model: type[M]) -> M:
    """Parse and validate ``path`` as ``model``; any problem raises SpecError naming the file and field."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SpecError(f"{path}: cannot be read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise SpecError(f"{path}: not valid YAML{line}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of fields at the top level, found {type(data).__name__}")
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = [f"  field `{_field(err)}`: {err['msg']} ({_fix_for(err)})" for err in exc.errors()]
        raise SpecError(
            f"{path}: {len(problems)} problem(s) in this {model.__name__}:\n" + "\n".join(problems)
        ) from None


def spec_names(folder: str) -> list[str]:
    """Names of the built-in specs in ``suite/<folder>/`` (file stems)."""
    return sorted(p.stem for p in (SPEC_ROOT / folder).glob("*.yaml"))


def find_spec_file(kind: str, folder: str, name_or_path: str) -> Path:
    """A built-in spec by name, or a user's YAML file by path."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml"):
        if not candidate.is_file():
            raise SpecError(f"{kind} spec file {candidate} does not exist")
        return candidate
    path = SPEC_ROOT / folder / f"{name_or_path}.yaml"
    if not path.is_file():
        raise UnknownNameError(kind, name_or_path, spec_names(folder))
    return path

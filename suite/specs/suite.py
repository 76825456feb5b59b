"""Suite specs (suite/suites/*.yaml): models × tasks × policies under one protocol, at one or more budgets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pydantic

from kvbench.specs.loading import StrictSpec, find_spec_file, load_spec, spec_names
from kvbench.specs.protocol import MAX_TOKENS


class SuiteSpec(StrictSpec):
    spec_version: Literal[1] = 1
    name: str
    description: str
    models: list[str] = pydantic.Field(min_length=1)
    tasks: list[str] = pydantic.Field(min_length=1)
    policies: list[str] = pydantic.Field(min_length=1)
    """Policies under test, as --policy text (``name`` or ``name:k=v``); the null and full are added."""
    protocol: str
    ratios: list[Annotated[float, pydantic.Field(gt=1.0, le=MAX_TOKENS)]] | None = pydantic.Field(
        default=None, min_length=1
    )
    """A budget sweep: K = N_avg/ratio for each ratio (default: the protocol's rule); each above 1."""
    limit: int | None = pydantic.Field(default=None, ge=1)
    """At most this many problems per task."""
    groups: dict[str, list[str]] = pydantic.Field(default_factory=dict)
    """Task groups compared pooled, clustered by (task, problem): ``{competition-math: [aime25, ...]}``."""

    @pydantic.model_validator(mode="after")
    def _groups_name_suite_tasks(self) -> SuiteSpec:
        if self.ratios is not None and len(set(self.ratios)) != len(self.ratios):
            raise ValueError(f"ratios {self.ratios} repeat a value: list each compression once")
        for name, members in self.groups.items():
            if len(set(members)) != len(members):
                raise ValueError(f"group {name!r} lists a task twice: {members}")
            unknown = [t for t in members if t not in self.tasks]
            if unknown or len(members) < 2:
                raise ValueError(
                    f"group {name!r} must list two or more of the suite's tasks ({', '.join(self.tasks)}); "
                    f"got {members}"
                )
        return self


def suite_names() -> list[str]:
    return spec_names("suites")


def load_suite(name_or_path: str | Path) -> SuiteSpec:
    return load_spec(find_spec_file("suite", "suites", str(name_or_path)), SuiteSpec)

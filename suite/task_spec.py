"""Task specs (tasks/*.yaml): where problems come from, how they are scored, and their reference N_avg."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Annotated, Literal

import pydantic

from kvbench.errors import UnknownNameError
from kvbench.specs import StrictSpec, load_spec


class ProbeSource(StrictSpec):
    """Seeded synthetic probes (EVALUATION.md, "Probes"), teacher-forced through the decode path."""

    kind: Literal["probe"]
    probe: Literal["passkey", "planted-fact", "fidelity"]
    problems: int = pydantic.Field(gt=0)
    length: int = pydantic.Field(gt=0)
    """Tokens of the teacher-forced trace (prompt excluded): the task's N_avg."""
    depth: int = 0
    """Filler tokens between the needle and its query (needle probes)."""
    pin_heads: int | None = None
    """planted-fact ablation: protect the needle's slots in exactly this many KV heads of every layer."""
    seed: int = 0


Source = Annotated[ProbeSource, pydantic.Field(discriminator="kind")]


class TaskSpec(StrictSpec):
    spec_version: Literal[1] = 1
    name: str
    version: int = 1
    """Bump when problems, prompts or scoring change: it is part of every result's identity."""
    description: str
    source: Source
    metric: str
    """The primary metric, higher is better (e.g. exact retrieval, top-1 agreement with the full cache)."""
    samples: int = pydantic.Field(default=1, gt=0)
    """Samples per problem; the samples of one problem decode as one batch."""
    visibility: Literal["public", "private"] = "public"
    """Private tasks never store or show problem or output text."""
    n_avg: dict[str, float] = pydantic.Field(default_factory=dict)
    """Reference mean generated length per model name; '*' applies to any model."""
    licence: str = "self-written synthetic data"

    def reference_n_avg(self, model: str) -> float | None:
        if model in self.n_avg:
            return self.n_avg[model]
        if "*" in self.n_avg:
            return self.n_avg["*"]
        if self.source.kind == "probe":
            return float(self.source.length)
        return None


def _task_dir() -> Path:
    return Path(str(files("kvbench.tasks")))


def task_names() -> list[str]:
    return sorted(p.stem for p in _task_dir().glob("*.yaml"))


def load_task(name_or_path: str | Path) -> TaskSpec:
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = _task_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            raise UnknownNameError("task", str(name_or_path), task_names())
    return load_spec(path, TaskSpec)

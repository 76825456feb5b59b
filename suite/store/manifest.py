"""A run's manifest (runs/shards/<run_id>/manifest.json), typed once: its resolved spec, its role and label,
the policy's documentation, the suite it was planned from, and where it ran (:class:`Provenance`).

Manifests written by earlier kvbench versions read back: a field they lack reads as None, and the spec is
the record the run id hashes, unchanged. A manifest that does not read back is refused by
:meth:`RunManifest.read` with its file and what is wrong (the callers set such a run aside).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TypeVar

import pydantic

from kvbench.errors import SpecError
from kvbench.specs.resolved import ResolvedSpec, Role
from kvbench.store.atomic import atomic_write

OUTPUT_HARDWARE = (
    "device", "cpu", "cpu_vector_features", "torch_threads", "torch_cuda",
    "gpu", "gpu_capability", "gpu_driver", "cudnn",
)  # fmt: skip
"""What of a machine decides a run's outputs bit for bit: the device, the CPU's model and vector features
and torch's threads (torch picks kernels by them, and they round differently), and a GPU's model,
capability, driver, CUDA and cuDNN; not the platform string, the core count or the GPU's memory."""


R = TypeVar("R", bound="Provenance")


class _Record(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class GitState(_Record):
    sha: str | None
    dirty: bool | None


class Provenance(_Record):
    """Where a result came from (kvbench.provenance.provenance): kvbench's version and commit, the library
    versions, Python and the machine."""

    kvbench: str | None = None
    git: GitState | None = None
    packages: dict[str, str | None] | None = None
    python: str | None = None
    hardware: dict[str, Any] | None = None

    @classmethod
    def validated(cls: type[R], data: Any, source: Path) -> R:
        """``data`` as this record, SpecError naming ``source`` and what is wrong otherwise. A stored spec's
        task is not checked against the graders installed here (it was when its run was planned)."""
        try:
            return cls.model_validate(data, context={"stored": True})
        except pydantic.ValidationError as exc:
            wrong = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
            raise SpecError(f"{source}: not a {cls.__name__} ({wrong})") from None

    def output_environment(self) -> dict[str, Any]:
        """What decides the outputs bit for bit: the library versions, Python and OUTPUT_HARDWARE. Two runs
        of one spec with the same environment give the same outputs; a field not recorded reads None,
        which matches no recorded value."""
        hardware = self.hardware or {}
        return {
            **(self.packages or {}),
            "python": self.python,
            **{name: hardware.get(name) for name in OUTPUT_HARDWARE},
        }

    def environment_changes(self, after: Provenance) -> list[str]:
        """``name old -> new`` for every field of the two output environments that differs (a field only
        one of them recorded included)."""
        before, now = self.output_environment(), after.output_environment()
        return [
            f"{name} {before.get(name)} -> {now.get(name)}"
            for name in sorted({*before, *now})
            if before.get(name) != now.get(name)
        ]


class PolicyDoc(pydantic.BaseModel):
    """The policy's documentation as the code that produced the numbers had it (kvbench.registry)."""

    model_config = pydantic.ConfigDict(frozen=True, extra="allow", populate_by_name=True)

    name: str | None = None
    summary: str | None = None
    module_doc: str | None = None
    module: str | None = None
    class_name: str | None = pydantic.Field(default=None, alias="class")
    source_sha256: str | None = None
    """A scorer's source hash (None for a kvpress press): what a bundle's shipped scorer must hash to."""
    needs: list[str] | None = None
    origin: str | None = None
    """``kvpress`` for a kvpress press, an installed package's code."""


class SuiteRecord(_Record):
    """The suite file a run was planned from: what a submission's bundle ships and `kvbench accept`
    checks."""

    name: str
    sha256: str
    yaml: str


class RunManifest(Provenance):
    """One run's manifest. The role is stored beside the spec (it is not part of the run id)."""

    run_id: str
    spec: ResolvedSpec
    """Stored as its record (ResolvedSpec.record), the fields as given: what the run id hashes."""
    role: Role = Role.POLICY
    label: str | None = None
    created: float | None = None
    policy_doc: PolicyDoc | None = None
    suite: SuiteRecord | None = None
    thinking: bool | None = None
    """Whether the graders read only the answer after ``</think>`` (None: a run from before it was
    recorded; its model spec says)."""
    memory_plan: dict[str, int] | None = None
    """The micro-batch the run's first problems were decoded in (kvbench.runner.memory)."""
    executor: dict[str, Any] | None = None
    """Where a distributed executor ran the units (kvbench.runner.ray_executor)."""

    @pydantic.model_validator(mode="before")
    @classmethod
    def _role_into_spec(cls, value: Any) -> Any:
        if isinstance(value, dict) and isinstance(value.get("spec"), dict):
            value = {**value, "spec": {**value["spec"], "role": value.get("role") or Role.POLICY}}
        return value

    @pydantic.field_serializer("spec")
    def _record(self, spec: ResolvedSpec) -> dict[str, Any]:
        return spec.record()

    @classmethod
    def read(cls, path: Path) -> RunManifest:
        """The manifest at ``path``; SpecError naming the file and what is wrong where it does not read."""
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SpecError(f"{path}: not a readable JSON manifest ({exc})") from None
        return cls.validated(data, path)

    def write(self, path: Path) -> None:
        """Written once, atomically: the fields given when it was made, a readable one never replaced."""
        try:
            RunManifest.read(path)
            return
        except SpecError:
            pass
        data = self.model_dump(mode="json", by_alias=True, exclude_unset=True)
        text = json.dumps({"created": time.time(), **data}, indent=2, default=str)
        atomic_write(path, lambda temp: temp.write_text(text))

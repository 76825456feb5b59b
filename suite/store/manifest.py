"""A run's manifest (runs/shards/<run_id>/manifest.json), typed once: its resolved spec, role and label,
the policy's documentation, the suite it was planned from, and where it ran. One written by an earlier
kvbench reads back, a field it lacks as None; one that does not read is refused naming its file and field.
"""

from __future__ import annotations

import contextlib
import json
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
    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")


class GitState(_Record):
    sha: str | None
    dirty: bool | None


class Provenance(_Record):
    """Where a result came from (kvbench.provenance): kvbench, the libraries, Python, the machine."""

    kvbench: str | None = None
    git: GitState | None = None
    packages: dict[str, str | None] | None = None
    python: str | None = None
    hardware: dict[str, Any] | None = None

    @classmethod
    def validated(cls: type[R], data: Any, source: Path) -> R:
        """``data`` as this record, else SpecError naming ``source`` and the fields that are wrong. A stored
        spec's task is not checked against the graders installed here (it was when its run was planned)."""
        try:
            return cls.model_validate(data, context={"stored": True})
        except pydantic.ValidationError as exc:
            wrong = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
            raise SpecError(f"{source}: not a {cls.__name__} ({wrong})") from None

    def output_environment(self) -> dict[str, Any]:
        """What decides the outputs bit for bit: the library versions, Python and OUTPUT_HARDWARE; a field
        not recorded reads None, which matches no recorded value."""
        machine = {k: (self.hardware or {}).get(k) for k in OUTPUT_HARDWARE}
        return {**(self.packages or {}), "python": self.python, **machine}

    def environment_changes(self, after: Provenance) -> list[str]:
        """``name old -> new`` for every field of the output environments that differs."""
        old, new = self.output_environment(), after.output_environment()
        return [f"{k} {old.get(k)} -> {new.get(k)}" for k in sorted({*old, *new}) if old.get(k) != new.get(k)]


class PolicyDoc(pydantic.BaseModel):
    """The policy's documentation as the code that produced the numbers had it (kvbench.registry)."""

    model_config = pydantic.ConfigDict(frozen=True, extra="allow")

    name: str | None = None
    class_name: str | None = pydantic.Field(default=None, alias="class")
    source_sha256: str | None = None
    """A scorer's source hash: what a bundle's shipped scorer must hash to."""
    origin: str | None = None
    """``kvpress`` for a kvpress press, an installed package's code."""


class SuiteRecord(_Record):
    """The suite file a run was planned from: what a bundle ships and `kvbench accept` checks."""

    name: str
    sha256: str
    yaml: str


class RunManifest(Provenance):
    """One run's manifest; its role is stored beside its spec, not in it (it is not in the run id)."""

    run_id: str
    spec: ResolvedSpec
    """Stored as its record, the fields as given: what the run id hashes."""
    role: Role = Role.POLICY
    label: str | None = None
    created: float | None = None
    policy_doc: PolicyDoc | None = None
    suite: SuiteRecord | None = None
    thinking: bool | None = None
    """Whether graders read only the answer after ``</think>`` (None: not recorded; its model spec says)."""
    memory_plan: dict[str, int] | None = None
    executor: dict[str, Any] | None = None
    """Where a distributed executor ran the units (kvbench.runner.ray_executor)."""

    @pydantic.model_validator(mode="before")
    @classmethod
    def _role_into_spec(cls, value: Any) -> Any:
        if not isinstance(value, dict) or not isinstance(value.get("spec"), dict):
            return value
        role = value.get("role") or Role.POLICY
        # left as it is (a list, a number, another word): the `role` field's check names it
        if not isinstance(role, str) or role not in {r.value for r in Role}:
            return value
        return {**value, "spec": {**value["spec"], "role": role}}

    @pydantic.field_serializer("spec")
    def _record(self, spec: ResolvedSpec) -> dict[str, Any]:
        return spec.record()

    @classmethod
    def read(cls, path: Path) -> RunManifest:
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SpecError(f"{path}: not a readable JSON manifest ({exc})") from None
        except RecursionError:  # arrays or objects nested past what Python's JSON reader follows
            raise SpecError(f"{path}: not a readable JSON manifest (nested too deeply)") from None
        return cls.validated(data, path)

    def write(self, path: Path) -> None:
        """Written once, atomically, with the fields it was given; a readable manifest is kept."""
        with contextlib.suppress(SpecError):  # none yet, or a damaged one
            RunManifest.read(path)
            return
        text = json.dumps(self.model_dump(mode="json", by_alias=True, exclude_unset=True), indent=2)
        atomic_write(path, lambda temp: temp.write_text(text))

"""The resolved spec: everything that decides a run's results, typed once, and the run's identity.

A cell carries one, a run's manifest stores it, a submission's bundle ships it, and every reader (the
store, comparisons, the leaderboard, `kvbench accept`) parses it with :meth:`ResolvedSpec.read`. Its
identity is the hash of its record: the fields as they were given, so that a spec written by an earlier
kvbench (before the runtime, the precision options or the budget's unit existed) keeps the identity it
was stored under.
"""

from __future__ import annotations

import hashlib
import json
from enum import Enum
from typing import Any

import pydantic

from kvbench.specs.loading import StrictSpec
from kvbench.specs.model import ModelSpec
from kvbench.specs.protocol import ProtocolSpec
from kvbench.specs.task import TaskSpec


def digest(value: Any) -> str:
    """The short stable hash of a JSON-able value (keys sorted): run ids, measurement keys, policy ids."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Role(str, Enum):
    """What a run is in a comparison: the policy under test, the null it must beat, or the full cache."""

    POLICY = "policy"
    NULL = "null"
    REFERENCE = "reference"

    def __str__(self) -> str:
        return self.value


class PolicyRecord(StrictSpec):
    name: str
    params: dict[str, Any]
    """Every parameter, resolved (defaults included)."""
    source_sha256: str | None = None
    """A file scorer's source hash (absent for built-ins): editing the file makes another run."""


class RuntimeRecord(pydantic.BaseModel):
    """Where the run ran; an adapter may add what else its results depend on (vLLM's version)."""

    model_config = pydantic.ConfigDict(extra="allow", frozen=True)

    adapter: str = "hf"
    device: str = "cpu"
    """The device's kind (``cuda``), never its index."""
    dtype: str | None = None
    attention: str = "sdpa"


class DataRecord(StrictSpec):
    """A local copy of a dataset replacing the hub's: its content is what the identity follows."""

    path: str
    sha256: str


class MeasurementRecord(StrictSpec):
    """The full-cache arm's measured N_avg that a ratio budget on a generation task follows."""

    measured: float
    declared: float | None
    reference_run: str
    problems: int
    samples: int


_BEFORE_RUNTIME = RuntimeRecord(adapter="hf", device="cpu", attention="sdpa")
"""A run planned before the runtime joined the identity ran with the hf adapter's defaults."""


class ResolvedSpec(pydantic.BaseModel):
    """One cell, fully resolved. Frozen; ``role`` is carried but is not part of the identity (the null's
    policy run under test and as the null is one run)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")

    runner_version: int
    runtime: RuntimeRecord | None = None
    """None only in runs planned before the runtime was recorded (see :attr:`ran_on`)."""
    model: ModelSpec
    task: TaskSpec
    policy: PolicyRecord
    protocol: ProtocolSpec
    budget: int | None
    """K in tokens per KV head; None for the full cache where its results do not depend on K."""
    n_avg: float | None
    ratio: float | None
    samples: int
    """Samples per problem."""
    limit: int | None
    """Problems of the task (None: all)."""
    # recorded only where they apply, so that a run without them keeps the identity it had before they existed
    n_avg_measurement: MeasurementRecord | None = pydantic.Field(default=None, exclude_if=lambda v: v is None)
    lm_eval: dict[str, Any] | None = pydantic.Field(default=None, exclude_if=lambda v: v is None)
    """An lm-eval task source's version, config and documents digest."""
    data: DataRecord | None = pydantic.Field(default=None, exclude_if=lambda v: v is None)
    role: Role = Role.POLICY

    @pydantic.model_validator(mode="before")
    @classmethod
    def _protocol_description(cls, value: Any) -> Any:
        # the identity leaves the protocol's description out; the typed protocol requires one
        if isinstance(value, dict) and isinstance(value.get("protocol"), dict):
            protocol = value["protocol"]
            if "description" not in protocol:
                value = {**value, "protocol": {**protocol, "description": ""}}
        return value

    @classmethod
    def read(cls, record: dict[str, Any], role: Role | None = None) -> ResolvedSpec:
        """A stored record (a manifest's ``spec``) as a typed spec; ``role`` from the manifest. Its task was
        checked when its run was planned, and is not against the graders installed where it is read."""
        return cls.model_validate({**record, "role": role or Role.POLICY}, context={"stored": True})

    def record(self) -> dict[str, Any]:
        """What a manifest stores and the identity hashes: the fields as given, the role and the protocol's
        description left out."""
        return self.model_dump(
            mode="json", exclude_unset=True, exclude={"role": True, "protocol": {"description"}}
        )

    @property
    def identity(self) -> str:
        """The run id."""
        return digest(self.record())

    @property
    def ran_on(self) -> RuntimeRecord:
        return self.runtime or _BEFORE_RUNTIME.model_copy(update={"dtype": self.model.dtype})

    def without(self, *fields: str) -> dict[str, Any]:
        """The record without some fields: what two runs that pair must share."""
        return {k: v for k, v in self.record().items() if k not in fields}

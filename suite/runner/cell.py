"""A cell, the unit a run is planned in: one model × task × policy × budget, where it runs, and its spec."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbench.adapters.base import find_adapter
from kvbench.core.contract import Policy
from kvbench.core.schedule import Schedule
from kvbench.specs.model import ModelSpec
from kvbench.specs.protocol import ProtocolSpec
from kvbench.specs.resolved import ResolvedSpec, Role, RuntimeRecord
from kvbench.specs.task import TaskSpec


@dataclass(frozen=True)
class PendingBudget:
    """K = N_avg / ratio where N_avg is the full-cache arm's mean generated length, measured when that arm
    has run (kvbench.runner.budgets settles the cell then)."""

    reference_run: str
    """The run id of the full-cache arm of this model and task, planned beside the cell."""
    key: str
    """The measurement's name: the full arm's identity without its problem limit and samples, so that an
    extended run (a larger --limit) finds the measurement its first run made and keeps the same K."""


@dataclass(frozen=True)
class Runtime:
    """Where and how the cells run: part of every identity, so that results computed on one kind of
    device, in one dtype or with one attention implementation are never reused for another."""

    adapter: str = "hf"
    device: str = "cpu"
    """As given (``cuda:1``); the identity keeps only its kind (``cuda``)."""
    attention: str = "sdpa"

    @property
    def device_kind(self) -> str:
        return self.device.split(":", 1)[0]

    def record(self, dtype: str) -> RuntimeRecord:
        adapter = find_adapter(self.adapter)
        return RuntimeRecord(
            adapter=self.adapter,
            device=self.device_kind,
            dtype=dtype,
            attention=self.attention,
            **getattr(adapter, "identity", dict)(),
        )


@dataclass(frozen=True)
class Cell:
    model: ModelSpec
    task: TaskSpec
    policy: Policy
    protocol: ProtocolSpec
    budget: int
    n_avg: float
    ratio: float | None
    samples: int
    limit: int | None
    spec: ResolvedSpec = field(compare=False)
    """What the cell's results depend on, typed: its manifest stores it, its identity is the run id."""
    data: str | None = None
    runtime: Runtime = Runtime()
    pending: PendingBudget | None = None
    """Set until the budget follows a measured N_avg; ``budget`` is then the declared estimate (0 without
    one) and ``run_id`` provisional."""
    suite: dict[str, str] | None = field(default=None, compare=False)
    """The suite file the cell was planned from (name, sha256, text): provenance, not identity, since
    suites that share a cell share its results."""

    @property
    def run_id(self) -> str:
        return self.spec.identity

    @property
    def role(self) -> Role:
        return self.spec.role

    def schedule(self) -> Schedule:
        schedule = self.protocol.schedule(self.budget, from_ratio=self.ratio is not None)
        # the no-eviction reference stays in the model's precision under every protocol, so that N_avg
        # (and hence K) is the same for a mixed-precision protocol and for eviction alone
        return schedule.without_precision() if self.role == Role.REFERENCE else schedule

    @property
    def label(self) -> str:
        budget = f"N_avg/{self.ratio:g}" if self.pending else str(self.budget)
        return f"{self.model.name}/{self.task.name}/{self.policy.name}@K={budget}"

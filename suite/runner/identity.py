"""A cell's identity: the hash of its fully resolved spec (model source and revision, task and version,
policy name and every parameter, protocol, budget, buffer, protection, sampling and seed). Results with
the same identity are reused, never recomputed; anything that changes a result changes the identity."""

from __future__ import annotations

from pathlib import Path

from kvbench.core.contract import Policy
from kvbench.registry import policy_record
from kvbench.runner.cell import Cell, PendingBudget, Runtime
from kvbench.runner.sources import task_source
from kvbench.specs.model import ModelSpec
from kvbench.specs.protocol import ProtocolSpec
from kvbench.specs.resolved import DataRecord, MeasurementRecord, PolicyRecord, ResolvedSpec, Role, digest
from kvbench.specs.task import TaskSpec
from kvbench.specs.task_data import data_fingerprint

RUNNER_VERSION = 1
"""Bump when the runner's scoring of a unit changes: it is part of every identity."""


def make_cell(
    model: ModelSpec,
    task: TaskSpec,
    policy: Policy,
    protocol: ProtocolSpec,
    *,
    budget: int,
    n_avg: float,
    ratio: float | None,
    samples: int,
    limit: int | None,
    role: Role,
    data: str | None = None,
    runtime: Runtime = Runtime(),  # noqa: B008 (frozen)
    pending: PendingBudget | None = None,
    measurement: MeasurementRecord | None = None,
    suite: dict[str, str] | None = None,
) -> Cell:
    """A cell and its identity; ``measurement`` records the measured N_avg a budget follows."""
    # the full cache's outputs do not depend on K, so one reference serves every budget; where its scores
    # do (they start at the first eviction event), K is part of its identity (protocol.md)
    full = role == Role.REFERENCE
    spec = ResolvedSpec(
        runner_version=RUNNER_VERSION,
        runtime=runtime.record(model.dtype),
        # every field set, defaults included: a new cell's record names them all
        model=ModelSpec.model_validate(model.model_dump(mode="json")),
        task=TaskSpec.model_validate(task.model_dump(mode="json")),
        policy=PolicyRecord.model_validate(policy_record(policy)),
        # the protocol's options that older releases lacked are recorded only when set otherwise
        protocol=ProtocolSpec.model_validate({**protocol.identity(), "description": protocol.description}),
        budget=None if full and not task.scored_from_first_eviction else budget,
        n_avg=n_avg,
        ratio=None if full else ratio,
        samples=samples,
        limit=limit,
        n_avg_measurement=measurement,
        # a local copy replaces the pinned hub revision: its content is the identity
        data=None if data is None else DataRecord(path=data, sha256=data_fingerprint(Path(data))),
        role=role,
        **task_source(task).identity(task),  # e.g. lm-eval's version, the task's config and documents
    )
    return Cell(
        model,
        task,
        policy,
        protocol,
        budget,
        n_avg,
        ratio,
        samples,
        limit,
        spec,
        data,
        runtime,
        pending,
        suite,
    )


def measurement_key(reference: Cell) -> str:
    """The name of the N_avg measured on a full-cache arm: its identity without the problem limit and the
    samples per problem, so that extending a run keeps the budget its first run measured."""
    return digest(reference.spec.without("limit", "samples"))

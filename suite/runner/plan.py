"""Expanding a suite (or a `kvbench run` command line) into cells: model × task × policy × budget.

A cell's identity is the hash of its fully resolved spec: model source and revision, task and version,
policy name and every parameter, protocol, budget, buffer, protection, sampling and seed. Results with
the same identity are reused, never recomputed; anything that changes a result changes the identity.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kvbench.contract import Policy
from kvbench.errors import SpecError
from kvbench.model_spec import ModelSpec, load_model_spec
from kvbench.protocol_spec import ProtocolSpec, load_protocol
from kvbench.registry import make_policy, policy_record
from kvbench.schedule import Schedule
from kvbench.suite_spec import SuiteSpec, load_suite
from kvbench.task_spec import TaskSpec, load_task

RUNNER_VERSION = 1
"""Bump when the runner's scoring of a unit changes: it is part of every identity."""

Role = Literal["policy", "null", "reference"]


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
    role: Role = "policy"
    data: str | None = None
    resolved: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def run_id(self) -> str:
        text = json.dumps(self.resolved, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def schedule(self) -> Schedule:
        return self.protocol.schedule(self.budget, from_ratio=self.ratio is not None)

    @property
    def label(self) -> str:
        return f"{self.model.name}/{self.task.name}/{self.policy.name}@K={self.budget}"


@dataclass(frozen=True)
class RunRequest:
    """What `kvbench run` was asked for; every field maps to one flag and is recorded."""

    suite: str = "quick"
    policies: tuple[str, ...] = ()
    protocol: str | None = None
    tasks: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    budget: int | None = None
    ratio: float | None = None
    samples: int | None = None
    limit: int | None = None
    seed: int | None = None
    baselines: bool = True
    data: str | None = None
    """A local copy of the (single) task's dataset in the hub's layout, replacing the hub."""
    max_new_tokens: int | None = None
    """Caps the generated tokens of reasoning tasks (part of the task, hence of the identity)."""
    allow_code_execution: bool = False
    """Code tasks run model-written programs (sandboxed); they refuse to start without this."""


def _make_cell(
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
) -> Cell:
    resolved = {
        "runner_version": RUNNER_VERSION,
        "model": model.model_dump(mode="json"),
        "task": task.model_dump(mode="json"),
        "policy": policy_record(policy),
        "protocol": protocol.model_dump(mode="json", exclude={"description"}),
        "budget": budget,
        "n_avg": n_avg,
        "ratio": ratio,
        "samples": samples,
        "limit": limit,
    }
    if data is not None:  # a local copy replaces the pinned hub revision: its content is the identity
        from kvbench.task_data import data_fingerprint

        resolved["data"] = {"path": data, "sha256": data_fingerprint(Path(data))}
    if role == "reference":  # the full cache does not depend on K: one reference serves every budget
        resolved["budget"] = resolved["ratio"] = None
    return Cell(model, task, policy, protocol, budget, n_avg, ratio, samples, limit, role, data, resolved)


def plan(request: RunRequest) -> list[Cell]:
    """Every cell the request needs, baselines included, in a stable order."""
    suite: SuiteSpec = load_suite(request.suite)
    protocol = load_protocol(request.protocol or suite.protocol)
    if request.seed is not None:
        protocol = protocol.model_copy(update={"seed": request.seed})
    models = [load_model_spec(m) for m in (request.models or suite.models)]
    tasks = [load_task(t) for t in (request.tasks or suite.tasks)]
    running_code = [t.name for t in tasks if t.grader == "code"]
    if running_code and not request.allow_code_execution:
        raise SpecError(
            f"task(s) {', '.join(running_code)} run model-written code (each test in a sandboxed subprocess "
            "with CPU, memory, wall-clock and network limits): pass --allow-code-execution to run them"
        )
    if request.max_new_tokens is not None:
        tasks = [t.model_copy(update={"max_new_tokens": request.max_new_tokens}) for t in tasks]
    if request.data is not None and (len(tasks) != 1 or tasks[0].source.kind != "hub-dataset"):
        raise SpecError("--data replaces one dataset: give exactly one --task, a hub-dataset task")
    policies = [make_policy(p) for p in (request.policies or suite.policies)]
    if request.budget is not None and request.ratio is not None:
        raise SpecError("give --budget (a fixed K) or --ratio (K = N_avg/ratio), not both")
    ratios: list[float | None] = [request.ratio] if request.ratio else list(suite.ratios or [None])
    cells: list[Cell] = []
    for model in models:
        if model.family not in protocol.sampling:
            raise SpecError(
                f"protocol {protocol.name!r} has no sampling for model family {model.family!r} "
                f"(model {model.name!r}): add `{model.family}: {{temperature: ..., top_p: ...}}` "
                "under `sampling`"
            )
        for task in tasks:
            n_avg = task.reference_n_avg(model.name)
            if n_avg is None and request.budget is None:
                raise SpecError(
                    f"task {task.name!r} has no reference N_avg for model {model.name!r}, so K = N_avg/ratio "
                    f"cannot be set: add `n_avg: {{{model.name}: ...}}` to the task or pass --budget"
                )
            for ratio in ratios:
                if request.budget is not None:
                    budget, used_ratio = request.budget, None
                else:
                    used_ratio = ratio or protocol.budget.ratio
                    rule = (
                        protocol.budget
                        if ratio is None
                        else protocol.budget.model_copy(update={"ratio": ratio})
                    )
                    budget = rule.budget(n_avg, protocol.buffer)
                arms: list[tuple[Policy, Role]] = [(p, "policy") for p in policies]
                if request.baselines:
                    arms += [
                        (make_policy(protocol.baseline), "null"),
                        (make_policy(protocol.reference), "reference"),
                    ]
                for policy, role in arms:
                    cell = _make_cell(
                        model,
                        task,
                        policy,
                        protocol,
                        budget=budget,
                        n_avg=n_avg or float("nan"),
                        ratio=used_ratio,
                        samples=request.samples or task.samples,
                        limit=request.limit if request.limit is not None else suite.limit,
                        role=role,
                        data=request.data,
                    )
                    if all(c.run_id != cell.run_id for c in cells):
                        cells.append(cell)
    return cells

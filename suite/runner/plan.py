"""Expanding a suite (or a `kvbench run` command line) into cells: model × task × policy × budget, and
the null and the full cache beside them (kvbench.runner.identity names each cell's results)."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

from kvbench.adapters.base import find_adapter
from kvbench.core.contract import Policy
from kvbench.errors import SpecError
from kvbench.graders.registry import check_code_execution
from kvbench.registry import make_policy, parse_policy_arg
from kvbench.runner.capabilities import check_capabilities
from kvbench.runner.cell import Cell, PendingBudget, Runtime
from kvbench.runner.identity import make_cell, measurement_key
from kvbench.runner.sources import resolved_task, task_source
from kvbench.specs.loading import find_spec_file, validate_values, with_overrides
from kvbench.specs.metric_kind import refuse_mixed_pool, task_metric
from kvbench.specs.model import ModelSpec, load_model_spec
from kvbench.specs.protocol import BudgetRule, ProtocolSpec, load_protocol
from kvbench.specs.resolved import Role
from kvbench.specs.suite import SuiteSpec, load_suite
from kvbench.specs.task import TaskSpec, load_task


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
    adapter: str = "hf"
    device: str = "cpu"
    dtype: str | None = None
    """Overrides the model spec's dtype (part of the identity through the model)."""
    attention: str = "sdpa"
    isolate: bool = False
    """Scorers from files run in a process of their own behind the sandbox (kvbench.isolation)."""
    scorer_seconds: float = 60.0
    """An isolated scorer's time limit per call (an event, loading its file) and CPU seconds per call."""
    scorer_memory: float = 4.0
    """GiB an isolated scorer's processes may hold resident, all together."""


def _policy(text: str, request: RunRequest) -> Policy:
    from kvbench.kvpress.catalog import press_of

    if press_of(text) is not None:  # a kvpress press, scored in kvpress's own environment
        from kvbench.kvpress.policy import kvpress_policy

        return kvpress_policy(text)
    if request.isolate and parse_policy_arg(text)[1] is not None:
        from kvbench.isolation.host import IsolationLimits, isolated

        limits = IsolationLimits(
            seconds_per_call=request.scorer_seconds, resident_bytes=int(request.scorer_memory * 2**30)
        )
        return isolated(text, limits)
    return make_policy(text)


def _runtime(request: RunRequest) -> Runtime:
    find_adapter(request.adapter)  # an unknown name is refused with the known ones
    import torch

    try:
        device = torch.device(request.device)
    except RuntimeError:
        raise SpecError(
            f"--device {request.device!r} is not a device torch knows: use cpu, cuda or cuda:N"
        ) from None
    return Runtime(adapter=request.adapter, device=str(device), attention=request.attention)


def _one_spec_per_name(models: list[ModelSpec]) -> None:
    by_name: dict[str, ModelSpec] = {}
    for model in models:
        held = by_name.setdefault(model.name, model)
        if held != model:
            raise SpecError(
                f"two different model specs are both named {model.name!r} in this run: results are stored "
                "and shown by model name, so give each spec its own `name`"
            )


def _budgets(
    request: RunRequest,
    protocol: ProtocolSpec,
    ratios: list[float | None],
    task: TaskSpec,
    model: str,
    n_avg: float | None,
) -> list[tuple[int, float | None, bool]]:
    """(K, the ratio that set it, whether K waits for a measured N_avg) for each ratio asked.

    --budget or a fixed rule sets K. A ratio on a generation task sets K = N_avg/ratio from the full-cache
    arm's measured N_avg (the declared ``n_avg`` is only the estimate shown until then); a probe's N_avg is
    its exact trace length.
    """
    if request.budget is not None:
        return [(request.budget, None, False)] * len(ratios)
    budgets: list[tuple[int, float | None, bool]] = []
    for ratio in ratios:
        rule = protocol.budget if ratio is None else protocol.budget.model_copy(update={"ratio": ratio})
        if rule.fixed is not None:
            budgets.append((rule.fixed, None, False))
        elif task_source(task).measured_n_avg:
            estimate = 0 if n_avg is None else rule.budget(n_avg, protocol.buffer)
            budgets.append((estimate, rule.ratio, True))
        elif n_avg is None:
            raise SpecError(
                f"task {task.name!r} has no reference N_avg for model {model!r}, so K = N_avg/ratio "
                f"cannot be set: add `n_avg: {{{model}: ...}}` to the task or pass --budget"
            )
        else:
            budgets.append((rule.budget(n_avg, protocol.buffer), rule.ratio, False))
    return budgets


PROBE_PROBLEMS_AT_MOST = 1000
"""The most problems a --limit may ask of a probe: a probe makes as many as asked (problem i seeded by its
index), and each costs its filler's tokenization before the first token."""


def refuse_probe_limit(task: TaskSpec, limit: int | None) -> None:
    """A --limit that would make a probe generate more than PROBE_PROBLEMS_AT_MOST problems, refused before
    any is made."""
    declared = task_source(task).made_to_order(task)
    if limit is None or declared is None or limit <= max(declared, PROBE_PROBLEMS_AT_MOST):
        return
    raise SpecError(
        f"--limit {limit}: task {task.name!r} is a probe of {declared} problems; a larger --limit "
        f"makes more (each seeded by its index), up to {PROBE_PROBLEMS_AT_MOST}: give a --limit of at most "
        f"{max(declared, PROBE_PROBLEMS_AT_MOST)}"
    )


def _tasks(request: RunRequest, suite: SuiteSpec) -> list[TaskSpec]:
    """The request's tasks (else the suite's), its flags applied and checked as the task fields they set."""
    tasks = [resolved_task(load_task(t)) for t in (request.tasks or suite.tasks)]
    if not request.tasks:  # the suite's groups are pooled after its run: refused now, not after it
        metrics = {listed: task_metric(task) for listed, task in zip(suite.tasks, tasks, strict=True)}
        for name, members in suite.groups.items():
            refuse_mixed_pool(f"suite {suite.name!r}, group {name!r},", {t: metrics[t] for t in members})
    check_code_execution(tasks, request.allow_code_execution)
    limit = request.limit if request.limit is not None else suite.limit
    for task in tasks:
        refuse_probe_limit(task, limit)
    if request.max_new_tokens is not None:
        flags = {"max_new_tokens": "--max-new-tokens"}
        tasks = [with_overrides(t, {"max_new_tokens": request.max_new_tokens}, flags) for t in tasks]
    if request.samples is not None:  # validated as the task field; recorded as the cell's samples
        for task in tasks:
            with_overrides(task, {"samples": request.samples}, {"samples": "--samples"})
    if request.data is not None:
        if len(tasks) != 1 or not task_source(tasks[0]).local_data:
            raise SpecError("--data replaces one dataset: give exactly one --task, a hub-dataset task")
        task_source(tasks[0]).check_data(tasks[0], Path(request.data))
    return tasks


def plan(request: RunRequest) -> list[Cell]:
    """Every cell the request needs, baselines included, in a stable order.

    Every command-line value is validated by the same rules as the YAML field it overrides, before
    anything loads; an error names the flag.
    """
    if request.budget is not None and request.ratio is not None:
        raise SpecError("give --budget (a fixed K) or --ratio (K = N_avg/ratio), not both")
    for name, flag, value in (("fixed", "--budget", request.budget), ("ratio", "--ratio", request.ratio)):
        if value is not None:
            validate_values(BudgetRule, {name: value}, {name: flag}, {name: value})
    runtime = _runtime(request)
    suite: SuiteSpec = load_suite(request.suite)
    text = find_spec_file("suite", "suites", request.suite).read_text(encoding="utf-8")
    origin = {"name": suite.name, "sha256": hashlib.sha256(text.encode()).hexdigest(), "yaml": text}
    if request.limit is not None:
        suite = with_overrides(suite, {"limit": request.limit}, {"limit": "--limit"})
    protocol = load_protocol(request.protocol or suite.protocol)
    if request.seed is not None:
        protocol = with_overrides(protocol, {"seed": request.seed}, {"seed": "--seed"})
    models = [load_model_spec(m) for m in (request.models or suite.models)]
    if request.dtype is not None:
        models = [with_overrides(m, {"dtype": request.dtype}, {"dtype": "--dtype"}) for m in models]
    _one_spec_per_name(models)
    tasks = _tasks(request, suite)
    policies = [_policy(p, request) for p in (request.policies or suite.policies)]
    ratios: list[float | None] = [request.ratio] if request.ratio is not None else [None]
    if request.ratio is None and suite.ratios:
        ratios = list(suite.ratios)
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
            cell_of = functools.partial(
                make_cell,
                model,
                task,
                protocol=protocol,
                n_avg=n_avg or float("nan"),
                samples=request.samples if request.samples is not None else task.samples,
                limit=suite.limit,
                data=request.data,
                runtime=runtime,
                suite=origin,
            )
            # the full arm's identity does not depend on K: it names the measurement of N_avg
            full = cell_of(make_policy(protocol.reference), budget=0, ratio=None, role=Role.REFERENCE)
            for budget, used_ratio, measured in _budgets(request, protocol, ratios, task, model.name, n_avg):
                pending = PendingBudget(full.run_id, measurement_key(full)) if measured else None
                arms: list[tuple[Policy, Role]] = [(p, Role.POLICY) for p in policies]
                if request.baselines:
                    arms += [
                        (make_policy(protocol.baseline), Role.NULL),
                        (make_policy(protocol.reference), Role.REFERENCE),
                    ]
                for policy, role in arms:
                    held = None if role == Role.REFERENCE else pending
                    cell = cell_of(policy, budget=budget, ratio=used_ratio, role=role, pending=held)
                    if all(c.run_id != cell.run_id for c in cells):
                        cells.append(cell)
    check_capabilities(cells)
    return cells

"""`kvbench verify`: re-compute every run of a bundle whole, on this machine, with this kvbench.

Each run is rebuilt from its resolved spec with this kvbench's specs and policies (a shipped scorer for
a policy that is not built in runs in a process of its own behind the sandbox and is never imported
here, so that it cannot reach the decode loop, the null, the graders or this process) and must hash to
the same identity. Then every problem and sample its spec names is computed here, through the same
engine and executors as `kvbench run`, into a work folder that an interrupted re-computation resumes
from. The bundle's own outputs are used only to say whether the claim matched.

Outcome per run: ``re-computed`` (every problem and sample computed here: its numbers are the
operator's), ``failed`` (it cannot be computed here: its scorer raised, hung or broke a limit, its
policy needs a version this machine lacks, its spec does not rebuild), or ``waiting`` (the operator
has yet to give something only they can: a task's local data with ``--data``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError
from kvbench.isolation.host import IsolatedPolicy, IsolationLimits
from kvbench.provenance import provenance
from kvbench.registry import builtin_policies, make_policy
from kvbench.results.check import outputs_digest
from kvbench.runner.executor import Executor
from kvbench.runner.memory import MemoryLimits, MemoryPlan
from kvbench.runner.orchestrate import run_cells
from kvbench.runner.plan import Cell, Runtime, make_cell
from kvbench.specs.resolved import digest
from kvbench.store.board_tables import DIFFERS, MATCHES
from kvbench.store.manifest import Provenance
from kvbench.store.shards import ShardStore
from kvbench.submissions.contents import StoredRun, load_samples, stored_runs
from kvbench.submissions.presses import is_press, press_policy
from kvbench.submissions.rules import Checked
from kvbench.submissions.text import json_problems, manifest_field

RECOMPUTED, FAILED, WAITING = "re-computed", "failed", "waiting"


@dataclass(frozen=True)
class Outcome:
    run_id: str
    """The run's identity, as the bundle names it."""
    label: str
    outcome: str
    """RECOMPUTED, FAILED or WAITING."""
    claim: str
    """MATCHES or DIFFERS (the re-computed outputs against the bundle's), "" unless re-computed."""
    problems: int
    samples: int
    seconds: float
    """Wall seconds of the re-computation the run was part of (its model's runs of one kind together)."""
    detail: str
    computed_run: str
    """The id the run was computed under in the work folder ("" unless re-computed)."""
    outputs: str
    """The re-computed outputs' digest ("" unless re-computed)."""
    machine: dict[str, Any]


@dataclass
class Recomputation:
    outcomes: list[Outcome]
    computed: int = 0
    """Problems computed by this call."""
    reused: int = 0
    """Problems found in the work folder, computed by an earlier, interrupted call."""


class OperatorInputError(KvbenchError):
    """Something only the operator can give is missing (a task's local data): the run waits, it has not
    failed."""


def rebuild(
    run: StoredRun,
    folder: Path,
    runtime: Runtime,
    data: Mapping[str, Path],
    limits: IsolationLimits | None = None,
) -> Cell:
    """The cell a run's resolved spec describes, built by this kvbench; its identity must be the run's
    (up to the runtime asked for and where the task's data lies here)."""
    spec, doc = run.spec, run.manifest.policy_doc
    name, params = spec.policy.name, spec.policy.params
    if name in builtin_policies():
        policy = make_policy(name, **params)
    elif is_press(name, doc):  # an installed package at the version the run recorded
        policy = press_policy(name, params)
    else:
        scorer = folder / "scorers" / f"{name}.py"
        if not scorer.is_file() or doc is None or doc.class_name is None:
            raise KvbenchError(f"policy {name!r} is not built in and the bundle ships no runnable scorer")
        # never imported here: it runs in a process of its own, behind the sandbox
        policy = IsolatedPolicy(scorer, doc.class_name, params, limits or IsolationLimits())
        if policy.name != name:
            raise KvbenchError(f"the bundle's scorer for {name!r} registers the name {policy.name!r}")
    local = None
    if spec.data is not None:
        if spec.task.name not in data:
            raise OperatorInputError(
                f"task {spec.task.name!r} ran on a local copy of its data: give it with --data "
                f"{spec.task.name}=PATH"
            )
        local = str(data[spec.task.name])
    measurement = spec.n_avg_measurement
    cell = make_cell(
        spec.model,
        spec.task,
        policy,
        spec.protocol,
        # a full cache whose scores do not depend on K records none; it never evicts at any K
        budget=spec.budget if spec.budget is not None else spec.protocol.buffer + 1,
        n_avg=spec.n_avg if spec.n_avg is not None else float("nan"),
        ratio=spec.ratio,
        samples=spec.samples,
        limit=spec.limit,
        role=spec.role,
        data=local,
        runtime=runtime,
        measurement=measurement,
    )
    if local is not None and (
        cell.spec.data is None or spec.data is None or cell.spec.data.sha256 != spec.data.sha256
    ):
        raise KvbenchError(f"--data for {spec.task.name}: its content is not the data the run used")
    # the runtime asked for here, and the local data's path here, are not the run's to match
    rebuilt = cell.spec.record()
    expected = {**spec.record(), "runtime": rebuilt["runtime"]}
    if "source_sha256" not in expected["policy"]:  # recorded before file scorers' identity held their hash
        rebuilt["policy"] = {k: v for k, v in rebuilt["policy"].items() if k != "source_sha256"}
    if local is not None:
        expected["data"] = rebuilt["data"]
    if digest(rebuilt) != digest(expected):
        differs = sorted(
            k for k in {*expected, *rebuilt} if digest(expected.get(k)) != digest(rebuilt.get(k))
        )
        raise KvbenchError(
            f"this kvbench rebuilds another spec from this run (differs in: {', '.join(differs)})"
        )
    return cell


WHY_CHARS = 1000
"""The longest reason kept for a failed run: the error's lines joined (a scorer's own text, escaped
wherever it is shown)."""


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:WHY_CHARS]


def runtime_here(run: StoredRun, device: str | None, attention: str | None) -> Runtime:
    """The runtime a run is computed on here: the one it recorded, but for a device or attention asked."""
    asked = run.spec.ran_on
    return Runtime(
        adapter=asked.adapter, device=device or asked.device, attention=attention or asked.attention
    )


def planned_cells(
    folder: Path,
    checked: Checked,
    only: Collection[str] | None,
    device: str | None,
    attention: str | None,
    data: Mapping[str, Path],
) -> list[Cell]:
    """The cells of the runs that rebuild here (``--plan-only``: what the re-computation would plan)."""
    cells = []
    for run in checked.runs:
        if only is None or run.run_id in only:
            with contextlib.suppress(KvbenchError):
                cells.append(rebuild(run, folder, runtime_here(run, device, attention), data))
    return cells


def recompute(
    folder: Path,
    checked: Checked,
    work: Path,
    *,
    only: Collection[str] | None = None,
    fresh: Collection[str] = (),
    device: str | None = None,
    attention: str | None = None,
    data: Mapping[str, Path] | None = None,
    limits: IsolationLimits | None = None,
    executor: Callable[[], Executor | None] = lambda: None,
    memory: MemoryLimits | None = None,
    show_plan: Callable[[MemoryPlan], None] | None = None,
    progress: bool = False,
) -> Recomputation:
    """Re-compute every problem and sample of the runs of a checked bundle (those in ``only``, by
    identity, where given) into ``work`` (a stored problem there is reused: an interrupted re-computation
    resumes; not for the runs in ``fresh``, which are computed again from nothing), and say of each run
    whether it was computed whole here and matches its claim."""
    done = Recomputation([])
    outcomes = done.outcomes
    here: dict[str, Provenance] = {}  # device -> this machine's provenance on it, read once
    groups: dict[tuple[str, str, bool], list[tuple[StoredRun, Cell]]] = {}
    for run in checked.runs:
        if only is not None and run.run_id not in only:
            continue
        label = run.manifest.label or run.run_id
        runtime = runtime_here(run, device, attention)
        where = runtime.device
        try:
            if where not in here:  # a device this machine lacks (cuda:9) is that run's failure, no other's
                here[where] = Provenance.model_validate(provenance(where))
        except Exception as exc:
            outcomes.append(Outcome(run.run_id, label, FAILED, "", 0, 0, 0.0, _why(exc), "", "", {}))
            continue
        machine = here[where].hardware or {}
        try:
            cell = rebuild(run, folder, runtime, data or {}, limits)
        except OperatorInputError as exc:
            outcomes.append(Outcome(run.run_id, label, WAITING, "", 0, 0, 0.0, str(exc), "", "", machine))
            continue
        except Exception as exc:  # a spec or scorer this machine cannot rebuild: say why, per run
            outcomes.append(Outcome(run.run_id, label, FAILED, "", 0, 0, 0.0, _why(exc), "", "", machine))
            continue
        if run.run_id in fresh:
            shutil.rmtree(ShardStore(work, cell.run_id).dir, ignore_errors=True)
        # a submitted scorer's cells run apart: its failure (a hang, a crash) leaves the null's runs whole
        submitted = isinstance(cell.policy, IsolatedPolicy)
        groups.setdefault((cell.model.name, runtime.device, submitted), []).append((run, cell))
    assert checked.samples is not None
    for members in groups.values():
        cells = [cell for _, cell in members]
        machine = here[cells[0].runtime.device].hardware or {}
        started = time.perf_counter()
        try:
            completed = run_cells(
                cells, work, executor(), progress=progress, memory=memory, show_plan=show_plan
            )
        except Exception as exc:  # a scorer that raised, hung or broke a limit; a model that cannot load
            for run, cell in members:
                outcomes.append(
                    Outcome(run.run_id, cell.label, FAILED, "", 0, 0, 0.0, _why(exc), "", "", machine)
                )
            continue
        seconds = time.perf_counter() - started
        done.computed += completed.timings.computed
        done.reused += completed.timings.reused
        for (run, _), cell in zip(members, completed.cells, strict=True):
            outcomes.append(_judge(run, cell, checked, work, seconds, machine))
    order = {run.run_id: i for i, run in enumerate(checked.runs)}
    outcomes.sort(key=lambda o: order[o.run_id])
    return done


def _judge(
    run: StoredRun, cell: Cell, checked: Checked, work: Path, seconds: float, machine: dict[str, Any]
) -> Outcome:
    """A run computed here: what it holds, and whether its outputs are those its bundle claimed."""
    assert checked.samples is not None
    store = ShardStore(work, cell.run_id)
    computed = [r for r in stored_runs(store.dir.parent)[0] if r.run_id == cell.run_id]
    samples, bad = load_samples(computed)
    with samples:
        if bad or not computed:
            why = f"its computed shards do not read back: {bad}" if bad else "nothing was computed"
            return Outcome(run.run_id, cell.label, FAILED, "", 0, 0, seconds, why, "", "", machine)
        found = samples.execute(
            "SELECT count(DISTINCT problem_id), count(*) FROM samples WHERE run_id = ?", [cell.run_id]
        ).fetchone()
        problems, count = found if found else (0, 0)
        outputs = outputs_digest(samples, cell.run_id)
    # what the scorer's own process reported of itself (its documentation) is a bundle's text too
    reported = list(json_problems(json.loads(store.manifest.read_bytes()), manifest_field))
    if reported:
        where, why = reported[0]
        detail = f"the scorer reported {where} {why} (the text rule)"
        return Outcome(run.run_id, cell.label, FAILED, "", 0, 0, seconds, detail, "", "", machine)
    claimed = outputs_digest(checked.samples, run.run_id)
    claim = MATCHES if outputs == claimed else DIFFERS
    detail = f"output digest {outputs}" + ("" if claim == MATCHES else f"; the bundle claimed {claimed}")
    return Outcome(
        run.run_id,
        cell.label,
        RECOMPUTED,
        claim,
        problems,
        count,
        seconds,
        detail,
        cell.run_id,
        outputs,
        machine,
    )

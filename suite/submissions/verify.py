"""`kvbench verify`: re-run a seeded random subset of a bundle's problems on this machine and compare.

Each run is rebuilt from its resolved spec with this kvbench's specs and policies (a shipped scorer for
a policy that is not built in, which runs in a process of its own behind the sandbox and is never
imported here, so that it cannot reach the decode loop, the null, the graders or this check), and must
hash to the same identity. N problems are drawn per family of
runs that share model, task, limit and runtime (a policy, its null and its full cache), from the
problems all of them hold, and re-run in each: they are checked on the same problems. The draw's seed
is random unless given, so that a submitter cannot know which problems will be re-run.

- Same machine: the same runtime (adapter, device kind, dtype, attention) and the same output
  environment as the run recorded (library versions, Python, CPU model, its vector features, torch
  threads, a GPU's model, driver, CUDA and cuDNN: kvbench.store.manifest.Provenance). The runs are
  deterministic given their seeds, so the outputs must be identical: the output digest over the drawn
  problems must match.
- Anywhere else (another GPU or CPU, other versions, or ``--device`` / ``--attention`` given): outputs may
  differ in the last bits, so the scores must agree: the mean paired difference (re-run − submitted)
  over the drawn problems must be within the half-width of the run's 95% interval from the bundle's
  samples. An environment the run did not record counts as another one.

Outcome per run: ``verified``, ``failed``, or ``not verified`` (it cannot run here: its adapter, device,
data or scorer is missing), with the machine that checked it.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from kvbench.errors import KvbenchError
from kvbench.isolation.host import IsolatedPolicy, IsolationLimits
from kvbench.provenance import provenance
from kvbench.registry import builtin_policies, make_policy
from kvbench.results.check import outputs_digest
from kvbench.results.pairing import cell_family
from kvbench.results.stats import bootstrap_mean
from kvbench.results.summary import summarize
from kvbench.runner.orchestrate import run_cells
from kvbench.runner.plan import Cell, Runtime, make_cell
from kvbench.specs.resolved import digest
from kvbench.store.manifest import Provenance
from kvbench.submissions.contents import StoredRun, copy_samples, load_samples, stored_runs
from kvbench.submissions.presses import is_press, press_policy
from kvbench.submissions.rules import Checked


@dataclass(frozen=True)
class Outcome:
    run_id: str
    label: str
    outcome: str
    """``verified``, ``failed`` or ``not verified``."""
    method: str
    """``identical outputs`` (this machine is the one the run recorded) or ``paired scores``."""
    problems: int
    detail: str
    machine: dict[str, Any]


def choose_problems(checked: Checked, count: int, seed: int) -> dict[str, list[str]]:
    """Run id -> ``count`` problem ids drawn with ``seed``, the same for every run of a family (the runs
    sharing model, task, limit and runtime), from the problems all of the family's runs hold."""
    assert checked.samples is not None
    held = dict(
        checked.samples.execute(
            "SELECT run_id, list(DISTINCT problem_id) FROM samples GROUP BY run_id"
        ).fetchall()
    )
    families: dict[str, list[str]] = {}
    for run in checked.runs:
        families.setdefault(cell_family(run.spec), []).append(run.run_id)
    chosen: dict[str, list[str]] = {}
    for family, run_ids in sorted(families.items()):
        common = sorted(set.intersection(*(set(held.get(run_id, ())) for run_id in run_ids)))
        picked = sorted(random.Random(f"{seed}:{family}").sample(common, min(count, len(common))))
        chosen |= dict.fromkeys(run_ids, picked)
    return chosen


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
            raise KvbenchError(
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


def _subset(con: duckdb.DuckDBPyConnection, run_id: str, problems: list[str]) -> duckdb.DuckDBPyConnection:
    """A DuckDB holding only ``problems`` of one run, under ``run_id``."""
    subset, _ = load_samples([])
    copy_samples(con, subset, "run_id = ? AND list_contains(?, problem_id)", [run_id, problems])
    return subset


def _judge(
    run: StoredRun,
    cell: Cell,
    checked: Checked,
    rerun: duckdb.DuckDBPyConnection,
    problems: list[str],
    exact: bool,
) -> tuple[str, str]:
    assert checked.samples is not None
    theirs = _subset(checked.samples, run.run_id, problems)
    ours = _subset(rerun, cell.run_id, problems)
    if exact:
        a, b = outputs_digest(theirs, run.run_id), outputs_digest(ours, cell.run_id)
        if a == b:
            return "verified", f"output digest {a} over {len(problems)} problem(s)"
        return "failed", f"the re-run's outputs digest to {b}, the bundle's to {a}"
    submitted = summarize(checked.samples, [run.run_id])[run.run_id].scores
    again = summarize(ours, [cell.run_id])[cell.run_id].scores
    missing = [p for p in problems if p not in again or p not in submitted]
    if missing:
        return "failed", f"{len(missing)} drawn problem(s) have no score in the re-run or the bundle"
    estimate = bootstrap_mean(list(submitted.values()))
    shift = sum(again[p] - submitted[p] for p in problems) / len(problems)
    half = (estimate.high - estimate.low) / 2
    detail = f"re-run − submitted {shift:+.4f} over {len(problems)} problem(s), half-interval {half:.4f}"
    return ("verified" if abs(shift) <= half else "failed"), detail


def verify(
    folder: Path,
    checked: Checked,
    *,
    count: int,
    seed: int = 0,
    device: str | None = None,
    attention: str | None = None,
    data: Mapping[str, Path] | None = None,
    scorer_seconds: float = 60.0,
    scorer_run_seconds: float = IsolationLimits.seconds_per_run,
    progress: bool = False,
) -> list[Outcome]:
    """Re-run ``count`` problems per task of every run in a checked bundle and judge each run."""
    chosen = choose_problems(checked, count, seed)
    outcomes: list[Outcome] = []
    notes: dict[str, str] = {}  # run id -> why its scores, not its outputs, are compared
    here: dict[str, Provenance] = {}  # device -> this machine's provenance on it, read once
    groups: dict[tuple[str, str, bool], list[tuple[StoredRun, Cell, bool]]] = {}
    for run in checked.runs:
        asked = run.spec.ran_on
        label = run.manifest.label or run.run_id
        where = device or asked.device
        if where not in here:
            here[where] = Provenance.model_validate(provenance(where))
        machine = here[where].hardware or {}
        if not chosen[run.run_id]:
            outcomes.append(
                Outcome(run.run_id, label, "not verified", "", 0, "no problem to re-run", machine)
            )
            continue
        try:
            runtime = Runtime(adapter=asked.adapter, device=where, attention=attention or asked.attention)
            cell = rebuild(
                run,
                folder,
                runtime,
                data or {},
                IsolationLimits(seconds_per_call=scorer_seconds, seconds_per_run=scorer_run_seconds),
            )
        except Exception as exc:  # a spec or scorer this machine cannot rebuild: say why, per run
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            outcomes.append(Outcome(run.run_id, label, "not verified", "", 0, why, machine))
            continue
        moved = run.manifest.environment_changes(here[where])
        exact = cell.spec.ran_on == asked and not moved
        if moved:
            notes[run.run_id] = f"; recorded on another machine ({', '.join(moved)})"
        # a submitted scorer's cells run apart: its failure (a hang, a crash) leaves the null's verdict
        submitted = isinstance(cell.policy, IsolatedPolicy)
        groups.setdefault((cell.model.name, runtime.device, submitted), []).append((run, cell, exact))
    with tempfile.TemporaryDirectory() as out_name:
        out = Path(out_name)
        for members in groups.values():
            cells = [cell for _, cell, _ in members]
            only = {cell.run_id: chosen[run.run_id] for run, cell, _ in members}
            machine = here[cells[0].runtime.device].hardware or {}
            try:
                run_cells(cells, out, progress=progress, only=only)
            except Exception as exc:  # the adapter, device or model cannot run here: say so per run
                for run, cell, _ in members:
                    why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    outcomes.append(Outcome(run.run_id, cell.label, "not verified", "", 0, why, machine))
                continue
            runs, _ = stored_runs(out / "shards")
            rerun, bad = load_samples(runs)
            if bad:
                raise KvbenchError(f"the re-run's shards do not read back: {bad}")
            for run, cell, exact in members:
                problems = chosen[run.run_id]
                outcome, detail = _judge(run, cell, checked, rerun, problems, exact)
                detail += notes.get(run.run_id, "")
                method = "identical outputs" if exact else "paired scores"
                outcomes.append(
                    Outcome(run.run_id, cell.label, outcome, method, len(problems), detail, machine)
                )
    order = {run.run_id: i for i, run in enumerate(checked.runs)}
    return sorted(outcomes, key=lambda o: order[o.run_id])

"""K = N_avg / ratio with N_avg measured: the full-cache arm's mean generated length on the same problems.

The full arm of a (model, task) runs first; its mean length over every sample is written once to
runs/budgets/<key>.json, where <key> names the full arm without its problem limit and samples per
problem. Every later run of that model and task (resumed, or extended with a larger --limit) reads the
same file, so its cells keep the same K and the same identities. The measured N_avg, the declared
estimate and the full arm it came from are part of every settled cell's identity.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pydantic

from kvbench.errors import BudgetError
from kvbench.runner.cell import Cell
from kvbench.specs.protocol import BudgetRule
from kvbench.specs.resolved import MeasurementRecord
from kvbench.store.atomic import atomic_write
from kvbench.store.shards import ShardStore, read_records

_STORED = ("reference_run", "problems", "samples", "declared")
"""A stored measurement's fields beside its mean, ``n_avg``."""


def measurement_path(out: Path, key: str) -> Path:
    return out / "budgets" / f"{key}.json"


def stored_measurement(out: Path, key: str) -> MeasurementRecord | None:
    """The measurement stored under ``key`` (its file names the mean ``n_avg``, as it always has)."""
    path = measurement_path(out, key)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return MeasurementRecord(**{name: data[name] for name in _STORED}, measured=data["n_avg"])
    except (json.JSONDecodeError, KeyError, TypeError, pydantic.ValidationError) as exc:
        raise BudgetError(
            f"{path} does not read back as a measured N_avg ({exc}); the budgets of its cells follow it, "
            "so it is never replaced silently: restore it, or delete it to measure N_avg again (the cells "
            "then get new identities)"
        ) from None


def measure(out: Path, reference: Cell, problem_ids: Sequence[str]) -> MeasurementRecord:
    """The mean generated length over every sample the full arm stored for these problems."""
    store = ShardStore(out, reference.run_id)
    missing = [p for p in problem_ids if not store.has(p)]
    if missing:
        raise BudgetError(
            f"{reference.label}: N_avg is measured on the full-cache arm, which has not stored problem(s) "
            f"{', '.join(missing)}: run it to the end (the same `kvbench run` again)"
        )
    lengths = [r.generated_tokens for p in problem_ids for r in read_records(store.shard(p))]
    return MeasurementRecord(
        measured=sum(lengths) / len(lengths),
        reference_run=reference.run_id,
        problems=len(problem_ids),
        samples=len(lengths),
        declared=reference.task.reference_n_avg(reference.model.name),
    )


def _write_once(path: Path, measurement: MeasurementRecord) -> MeasurementRecord:
    """Write the measurement unless another process already has; either way, the stored one wins."""
    stored = {"n_avg": measurement.measured, **measurement.model_dump(include=set(_STORED))}
    text = json.dumps({**stored, "created": time.time()}, indent=2)
    atomic_write(path, lambda temp: temp.write_text(text), once=True)  # a run that measured first wins
    return stored_measurement(path.parent.parent, path.stem) or measurement


def settle(cell: Cell, measurement: MeasurementRecord) -> Cell:
    """The cell at K = N_avg / ratio from the measured N_avg, with that measurement in its identity."""
    if cell.pending is None or cell.ratio is None:
        return cell
    budget = BudgetRule(ratio=cell.ratio).budget(measurement.measured, cell.protocol.buffer)
    settled = {"budget": budget, "n_avg": measurement.measured, "n_avg_measurement": measurement}
    spec = cell.spec.model_copy(update=settled)  # a pending cell is never the full cache: K is its own
    return replace(cell, budget=budget, n_avg=measurement.measured, pending=None, spec=spec)


def check_measurable(cells: Sequence[Cell], out: Path) -> None:
    """Before anything runs: every pending cell can get its N_avg, stored or from a full arm in this run."""
    planned = {c.run_id for c in cells}
    for cell in cells:
        pending = cell.pending
        if pending and pending.reference_run not in planned and stored_measurement(out, pending.key) is None:
            raise BudgetError(
                f"{cell.label}: K = N_avg/{cell.ratio:g} follows the full cache's measured N_avg on "
                f"{cell.model.name}/{cell.task.name}, and none is stored in {out}: run the full-cache arm "
                "(drop --no-baselines) or give a fixed K with --budget"
            )


def settle_all(cells: Sequence[Cell], out: Path, problem_ids: dict[str, list[str]]) -> list[Cell]:
    """The cells in their order, every pending one settled: from the stored measurement, else measured now
    on its full arm (among ``cells``, and run, over its problems in ``problem_ids``: run id -> ids) and
    stored."""
    by_id = {c.run_id: c for c in cells}
    settled = []
    for cell in cells:
        pending = cell.pending
        if pending is None:
            settled.append(cell)
            continue
        measurement = stored_measurement(out, pending.key)
        if measurement is None:
            reference = by_id[pending.reference_run]
            fresh = measure(out, reference, problem_ids[reference.run_id])
            measurement = _write_once(measurement_path(out, pending.key), fresh)
        settled.append(settle(cell, measurement))
    return settled

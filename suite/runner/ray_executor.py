"""Running cells on a Ray cluster (``kvbench run --executor ray``): the same units, the same shards.

A unit of work is one problem of one cell, as in the local executor. Each model replica is a Ray actor
that loads the model once and serves many units. Each actor reserves the resources its runtime needs:
a GPU on CUDA runtimes, ``cpus_per_worker`` CPUs otherwise. Units go to idle actors, longest expected
first. A unit is written once, under its identity, by the shard store's atomic rename:

- ``results="shared"`` (the default): the actor writes the shard into the results folder, which every
  node must reach (a shared filesystem path).
- ``results="driver"``: the actor returns the rows and the driver writes them; no shared filesystem is
  needed, but every row crosses the network.

An actor that dies is restarted by Ray (the model loads again) and its unit is retried. The retry writes
the same file under the same name, so no sample is lost or duplicated. Units that still fail are named
at the end and are computed by the next run. Ingest happens once, on the driver, as with the local
executor.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvbench.errors import KvbenchError, PrerequisiteError
from kvbench.runner.budgets import check_measurable, settle_all
from kvbench.runner.execute import Completed, Timings, manifest_notes
from kvbench.runner.plan import Cell
from kvbench.store.shards import ShardStore

Results = Literal["shared", "driver"]
RETRIES = 3
"""How often a unit is retried after its worker died (Ray's max_task_retries)."""


class UnitWorker:
    """One model replica: the model loaded once, and every unit of its cells scored on it."""

    def __init__(self, model: Any, runtime: Any, out: str, threads: int | None) -> None:
        import torch

        from kvbench.adapters.base import find_adapter
        from kvbench.runner.execute import Graders

        if threads:
            # CPU numbers depend on torch's thread count: the actor uses exactly what it reserved
            torch.set_num_threads(threads)
        started = time.perf_counter()
        adapter = find_adapter(runtime.adapter)
        self.backend = adapter.load(model, device=runtime.device, attention=runtime.attention, progress=False)
        self.load_seconds = time.perf_counter() - started
        self.runtime = runtime
        self.out = Path(out)
        self.graders = Graders()
        self.calibrations: dict = {}
        self.problems: dict[tuple[str, int | None, str | None], dict[str, Any]] = {}

    def where(self) -> dict[str, Any]:
        """The node, host and process this replica runs on, and that machine's provenance."""
        import ray

        from kvbench.provenance import provenance

        return {
            "node": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "load_seconds": self.load_seconds,
            "provenance": provenance(self.runtime.device),
        }

    def _problems(self, cell: Cell) -> dict[str, Any]:
        from kvbench.runner.execute import cell_problems

        key = (cell.task.name, cell.limit, cell.data)
        if key not in self.problems:
            self.problems[key] = {p.problem_id: p for p in cell_problems(cell, self.backend)}
        return self.problems[key]

    def prepare(self, cells: list[Cell]) -> dict[str, list[str]]:
        """Each task's problem ids, after refusing a cell whose budget cannot protect its prompts."""
        from kvbench.runner.execute import check_cells

        problems = {c.task.name: list(self._problems(c).values()) for c in cells}
        check_cells([c for c in cells if c.pending is None], self.backend, problems)
        return {name: [p.problem_id for p in found] for name, found in problems.items()}

    def run(self, cell: Cell, problem_id: str, write: bool) -> dict[str, Any]:
        """Score one unit; write its shard (``write``) or return its rows to the driver."""
        import ray

        from kvbench.runner.execute import calibration_for, score_unit

        store = ShardStore(self.out, cell.run_id)
        node = ray.get_runtime_context().get_node_id()
        if write and store.has(problem_id):  # a retry after the shard landed: nothing to do
            return {"node": node, "computed": False, "rows": None, "seconds": 0.0, "eviction": 0.0}
        timings = Timings()
        calibration = calibration_for(cell, self.backend, self.calibrations, timings)
        started = time.perf_counter()
        rows = score_unit(cell, self.backend, self._problems(cell)[problem_id], calibration, self.graders)
        if write:
            store.write(problem_id, rows)
        return {
            "node": node,
            "computed": True,
            "rows": None if write else rows,
            "seconds": time.perf_counter() - started,
            "eviction": sum(r.eviction_seconds for r in rows),
            "calibration": timings.calibration,
        }

    def close(self) -> None:
        self.graders.close()
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None
    """A running cluster (``ray start --head`` prints it); None starts a local one in this process."""
    workers: int | None = None
    """Model replicas per model; default: as many as the cluster's resources hold."""
    cpus_per_worker: float | None = None
    """CPUs each replica reserves on CPU runtimes (its torch threads); default: a node's CPU count, which
    gives each replica the thread count a local run on that node has, hence the same numbers."""
    gpus_per_worker: int = 1
    """GPUs each replica reserves on CUDA runtimes (a model that needs several GPUs)."""
    results: Results = "shared"


@dataclass
class _Progress:
    """Units done / running / failed per node, shown under one aggregated bar."""

    done: Counter = field(default_factory=Counter)
    running: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)

    def line(self) -> str:
        nodes = sorted(set(self.done) | set(self.running) | set(self.failed))
        return "  ".join(
            f"node {n[:8]}: {self.done[n]} done, {self.running[n]} running, {self.failed[n]} failed"
            for n in nodes
        )


def _expected_tokens(cell: Cell) -> float:
    """A unit's expected cost, for longest-first scheduling: its samples × their expected length."""
    source = cell.task.source
    length = getattr(source, "length", None) or cell.task.reference_n_avg(cell.model.name)
    return cell.samples * float(length or cell.task.max_new_tokens)


def run_cells_ray(
    cells: Sequence[Cell], out: Path, options: RayOptions = RayOptions(), *, progress: bool = True
) -> Completed:
    """Run every cell on a Ray cluster; what is stored already is skipped, as locally."""
    try:
        import ray
    except ImportError:
        raise PrerequisiteError(
            "--executor ray needs Ray: pip install 'kvbench[ray]' (on every node of the cluster)"
        ) from None
    check_measurable(cells, out)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=options.address, log_to_driver=False, configure_logging=False)
    timings = Timings()
    ran: dict[str, Cell] = {}
    try:
        for model, runtime in dict.fromkeys((c.model, c.runtime) for c in cells):
            group = [c for c in cells if (c.model, c.runtime) == (model, runtime)]
            ran |= _ModelOnRay(group, out, options, timings, progress).run()
    finally:
        if started_here:
            ray.shutdown()
    return Completed(cells=[ran[c.run_id] for c in cells], timings=timings)


class _ModelOnRay:
    """One model's cells: its replicas, the ready cells' units, then those whose K waited for N_avg."""

    def __init__(self, cells: list[Cell], out: Path, options: RayOptions, timings: Timings, progress: bool):
        self.cells, self.out, self.options = cells, out, options
        self.timings, self.progress = timings, progress
        self.failures: list[str] = []

    def _replicas(self) -> list[Any]:
        import ray

        runtime, model = self.cells[0].runtime, self.cells[0].model
        resources = ray.cluster_resources()
        if runtime.device_kind == "cuda":
            gpus = self.options.gpus_per_worker
            fits = int(resources.get("GPU", 0) // gpus)
            reserve: dict[str, Any] = {"num_gpus": gpus, "num_cpus": 1}
            threads = None
        else:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            per_node = min(int(n["Resources"].get("CPU", 1)) for n in nodes) if nodes else 1
            cpus = self.options.cpus_per_worker or per_node
            fits = int(resources.get("CPU", 1) // cpus)
            reserve = {"num_cpus": cpus}
            threads = max(1, int(cpus))
        count = self.options.workers or fits
        if count < 1 or fits < 1:
            raise KvbenchError(
                f"the Ray cluster cannot hold one replica of {model.name} ({reserve}; it has "
                f"{dict(resources)}): add nodes or lower --ray-cpus-per-worker / --ray-gpus-per-worker"
            )
        actor = ray.remote(UnitWorker).options(**reserve, max_restarts=-1, max_task_retries=RETRIES)
        # absolute: a replica runs in a working folder of its own (on another node: the same mount path)
        return [actor.remote(model, runtime, str(self.out.resolve()), threads) for _ in range(count)]

    def run(self) -> dict[str, Cell]:
        import ray

        replicas = self._replicas()
        try:
            places = ray.get([r.where.remote() for r in replicas])
            self.timings.model_load += max(p["load_seconds"] for p in places)
            provenance = {**places[0]["provenance"], "executor": _executor_record(places, self.options)}
            ready = [c for c in self.cells if c.pending is None]
            ids = ray.get(replicas[0].prepare.remote(ready))
            nodes = {id(r): p["node"] for r, p in zip(replicas, places, strict=True)}
            self._run_units(ready, ids, replicas, nodes, provenance)
            as_ran = settle_all(self.cells, self.out, ids)
            settled = [after for before, after in zip(self.cells, as_ran, strict=True) if before.pending]
            if settled:
                ray.get(replicas[0].prepare.remote(settled))  # the settled budgets against the prompts
                self._run_units(settled, ids, replicas, nodes, provenance)
        finally:
            for replica in replicas:
                with contextlib.suppress(Exception):  # a replica that is gone has nothing to close
                    ray.get(replica.close.remote(), timeout=30)
                ray.kill(replica)
        if self.failures:
            raise KvbenchError(
                f"{len(self.failures)} unit(s) failed after {RETRIES} retries; the stored ones are kept and "
                "a rerun computes only what is missing:\n  " + "\n  ".join(self.failures[:20])
            )
        return {before.run_id: after for before, after in zip(self.cells, as_ran, strict=True)}

    def _run_units(
        self, cells: list[Cell], ids: dict[str, list[str]], replicas: list, nodes: dict, provenance: dict
    ) -> None:
        """Every unit not stored yet, each on the next idle replica, until all are done or failed."""
        import ray

        units: list[tuple[Cell, str]] = []
        for cell in cells:
            store = ShardStore(self.out, cell.run_id)
            store.write_manifest(cell.resolved, {**provenance, **manifest_notes(cell)})
            for problem_id in ids[cell.task.name]:
                if store.has(problem_id):
                    self.timings.reused += 1
                else:
                    units.append((cell, problem_id))
        units.sort(key=lambda unit: -_expected_tokens(unit[0]))  # longest first (a stable sort)
        write = self.options.results == "shared"
        state = _Progress()
        idle = list(replicas)
        pending: dict[Any, tuple[Cell, str, Any]] = {}
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, disable=not self.progress, transient=True) as bar:
            task = bar.add_task(self.cells[0].model.name, total=len(units))
            queue = list(units)
            while queue or pending:
                while queue and idle:
                    cell, problem_id = queue.pop(0)
                    replica = idle.pop()
                    pending[replica.run.remote(cell, problem_id, write)] = (cell, problem_id, replica)
                    state.running[nodes[id(replica)]] += 1
                finished, _ = ray.wait(list(pending), num_returns=1)
                for ref in finished:
                    cell, problem_id, replica = pending.pop(ref)
                    state.running[nodes[id(replica)]] -= 1
                    # Ray restarts a dead replica (max_restarts=-1), so it serves the next unit either way
                    idle.append(replica)
                    try:
                        result = ray.get(ref)
                    except Exception as exc:  # its retries exhausted, or the unit itself raised
                        state.failed[nodes[id(replica)]] += 1
                        self.failures.append(f"{cell.label} {problem_id}: {type(exc).__name__}: {exc}"[:500])
                        continue
                    store = ShardStore(self.out, cell.run_id)
                    if result["rows"] is not None:
                        store.write(problem_id, result["rows"])
                    elif not store.has(problem_id):
                        raise KvbenchError(
                            f"a replica on node {result['node'][:8]} wrote {cell.label} {problem_id} into "
                            f"{self.out.resolve()}, but this machine does not see it there: --out must be a "
                            "folder every node reaches at the same path, or use --ray-results driver"
                        )
                    state.done[result["node"]] += 1
                    self.timings.computed += int(result["computed"])
                    self.timings.units += result["seconds"]
                    self.timings.eviction += result["eviction"]
                    self.timings.calibration += result.get("calibration", 0.0)
                    by = self.timings.by_cell
                    by[cell.label] = by.get(cell.label, 0.0) + result["seconds"]
                    bar.advance(task)
                bar.update(task, description=f"{self.cells[0].model.name}  {state.line()}")


def _executor_record(places: list[dict[str, Any]], options: RayOptions) -> dict[str, Any]:
    """What the manifest records of the executor: provenance, not identity (a unit's numbers do not
    depend on which node ran it, on the same device kind and thread count)."""
    nodes: dict[str, list[str]] = defaultdict(list)
    for place in places:
        nodes[place["node"]].append(f"{place['host']}:{place['pid']}")
    return {
        "kind": "ray",
        "address": options.address,
        "results": options.results,
        "replicas": len(places),
        "nodes": dict(nodes),
        "torch_threads": sorted({p["provenance"]["hardware"].get("torch_threads") for p in places}),
    }

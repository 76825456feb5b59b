"""An executor (kvbench.runner.executor) for ``kvbench run --executor ray``: the same units, the same shards.

A unit of work is one problem of one cell. Each model replica is a Ray actor that loads the model once
and serves many units. Each actor reserves the resources its runtime needs: a GPU on CUDA runtimes,
``cpus_per_worker`` CPUs otherwise. Units go to idle actors, longest expected first. A unit is written
once, under its identity, by the shard store's atomic rename:

- ``results="shared"`` (the default): the actor writes the shard into the results folder, which every
  node must reach (a shared filesystem path).
- ``results="driver"``: the actor returns the rows and the driver writes them; no shared filesystem is
  needed, but every row crosses the network.

An actor that dies is restarted by Ray (the model loads again) and its unit is retried. The retry writes
the same file under the same name, so no sample is lost or duplicated. Units that still fail are named
at the end and computed by the next run. Ingest happens once, on the driver, as with the local executor.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from kvbench.errors import KvbenchError, PrerequisiteError

try:
    import ray
except ImportError:
    raise PrerequisiteError(
        "--executor ray needs Ray: pip install 'kvbench[ray]' (on every node of the cluster)"
    ) from None
from kvbench.provenance import provenance
from kvbench.runner.cell import Cell
from kvbench.runner.execute import Replica
from kvbench.runner.executor import Prepared, Unit, UnitResult
from kvbench.store.shards import ShardStore

Results = Literal["shared", "driver"]
RETRIES = 3
"""How often a unit is retried after its worker died (Ray's max_task_retries)."""


class UnitWorker(Replica):
    """One model replica: the model loaded once, and every unit of its cells scored on it."""

    def __init__(self, model: Any, runtime: Any, out: str, threads: int | None) -> None:
        if threads:
            import torch

            # CPU numbers depend on torch's thread count: the actor uses exactly what it reserved
            torch.set_num_threads(threads)
        super().__init__(model, runtime, progress=False)
        self.out = Path(out)

    def where(self) -> dict[str, Any]:
        """The node, host and process this replica runs on, and that machine's provenance."""
        return {
            "node": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "load_seconds": self.load_seconds,
            "provenance": provenance(self.key[1].device),
        }

    def run(self, unit: Unit, write: bool) -> UnitResult:
        """Score one unit; write its shard (``write``) or return its rows to the driver."""
        store = ShardStore(self.out, unit.cell.run_id)
        if write and store.has(unit.problem_id):  # a retry after the shard landed: nothing to do
            return UnitResult(unit, None, computed=False)
        result = self.score(unit)
        if not write:
            return result
        store.write(unit.problem_id, result.rows or ())
        return replace(result, rows=None)


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


def _progress(counts: Counter) -> str:
    """Units done / running / failed per node, shown under one aggregated bar."""
    nodes = sorted({node for node, _ in counts})
    states = ("done", "running", "failed")
    return "  ".join(f"node {n[:8]}: " + ", ".join(f"{counts[n, s]} {s}" for s in states) for n in nodes)


class RayExecutor:
    """Units on Ray actors, one model's replicas at a time (kvbench.runner.executor)."""

    def __init__(self, out: Path, options: RayOptions = RayOptions()) -> None:
        self.out, self.options, self.started_here = out, options, False
        self.key: tuple[Any, Any] | None = None  # the model and runtime the replicas hold
        self.replicas: list[tuple[Any, str]] = []  # each replica's actor and the node it runs on
        self.provenance: dict[str, Any] = {}

    def prepare(self, cells: Sequence[Cell]) -> Prepared:
        if not ray.is_initialized():
            ray.init(address=self.options.address, log_to_driver=False, configure_logging=False)
            self.started_here = True
        load = 0.0
        if self.key != (cells[0].model, cells[0].runtime):
            self._release()
            self.key = (cells[0].model, cells[0].runtime)
            actors = self._replicas(cells[0])
            places = ray.get([r.where.remote() for r in actors])
            load = max(p["load_seconds"] for p in places)
            self.provenance = {**places[0]["provenance"], "executor": _executor_record(places, self.options)}
            self.replicas = [(r, p["node"]) for r, p in zip(actors, places, strict=True)]
        replica = self.replicas[0][0]  # any replica: one model
        problems = ray.get(replica.prepare.remote(list(cells)))
        return Prepared(problems, self.provenance, load, ray.get(replica.device_facts.remote(list(cells))))

    def _replicas(self, cell: Cell) -> list[Any]:
        runtime, model = cell.runtime, cell.model
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

    def run(self, units: Sequence[Unit], status: Callable[[str], None]) -> Iterator[UnitResult]:
        """Every unit, each on the next idle replica, longest expected first, until all are done or failed."""
        queue = sorted(units, key=lambda unit: -unit.cost)  # a stable sort
        write = self.options.results == "shared"
        state: Counter = Counter()  # (node, done | running | failed) -> units
        idle = list(self.replicas)
        pending: dict[Any, tuple[Unit, tuple[Any, str]]] = {}
        while queue or pending:
            while queue and idle:
                unit, (actor, node) = queue.pop(0), idle.pop()
                pending[actor.run.remote(unit, write)] = (unit, (actor, node))
                state[node, "running"] += 1
            finished, _ = ray.wait(list(pending), num_returns=1)
            for ref in finished:
                unit, (actor, node) = pending.pop(ref)
                state[node, "running"] -= 1
                # Ray restarts a dead replica (max_restarts=-1), so it serves the next unit either way
                idle.append((actor, node))
                try:
                    result = ray.get(ref)
                except Exception as exc:  # its retries exhausted, or the unit itself raised
                    state[node, "failed"] += 1
                    yield UnitResult(unit, None, computed=False, error=f"{type(exc).__name__}: {exc}")
                    continue
                if result.rows is None and not ShardStore(self.out, unit.cell.run_id).has(unit.problem_id):
                    raise KvbenchError(
                        f"a replica on node {node[:8]} wrote {unit.cell.label} {unit.problem_id} into "
                        f"{self.out.resolve()}, but this machine does not see it there: --out must be a "
                        "folder every node reaches at the same path, or use --ray-results driver"
                    )
                state[node, "done"] += 1
                yield result
            status(f"{units[0].cell.model.name}  {_progress(state)}")

    def _release(self) -> None:
        for replica, _ in self.replicas:
            with contextlib.suppress(Exception):  # a replica that is gone has nothing to close
                ray.get(replica.close.remote(), timeout=30)
            ray.kill(replica)
        self.replicas, self.key = [], None

    def close(self) -> None:
        self._release()
        if self.started_here:
            ray.shutdown()


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

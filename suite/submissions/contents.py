"""What a bundle's runs hold, read the same way on the exporting and the accepting side: each run's
manifest and shards, its samples in an in-memory DuckDB, and the output digest `kvbench check` uses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from kvbench.errors import SpecError
from kvbench.specs.resolved import ResolvedSpec, Role
from kvbench.store.ingest import insert_rows
from kvbench.store.manifest import RunManifest
from kvbench.store.records import SAMPLE_KEY, SampleRecord, table_ddl
from kvbench.submissions.tables import MAX_DECODED_BYTES, OverBound, read_bounded_shard


@dataclass(frozen=True)
class StoredRun:
    """One run's files in a folder laid out as ``<run_id>/manifest.json`` and ``<run_id>/*.parquet``."""

    run_id: str
    folder: Path
    manifest: RunManifest

    @property
    def spec(self) -> ResolvedSpec:
        return self.manifest.spec

    @property
    def role(self) -> Role:
        return self.manifest.role

    @property
    def shards(self) -> list[Path]:
        return sorted(self.folder.glob("*.parquet"))


def stored_runs(root: Path) -> tuple[list[StoredRun], dict[str, str]]:
    """Every run folder under ``root`` with a readable manifest, and the folders without one: why not."""
    runs, broken = [], {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        path = folder / "manifest.json"
        try:
            runs.append(StoredRun(folder.name, folder, RunManifest.read(path)))
        except SpecError as exc:
            broken[folder.name] = str(exc).removeprefix(f"{path}: ")
        except Exception as exc:  # a submitter's manifest of any shape: named, never a traceback
            broken[folder.name] = f"not a RunManifest ({type(exc).__name__}: {str(exc)[:200]})"
    return runs, broken


def load_samples(
    runs: list[StoredRun],
) -> tuple[duckdb.DuckDBPyConnection, list[tuple[Path, str, str]]]:
    """An in-memory DuckDB whose ``samples`` table holds every shard of ``runs``, and the shards that do
    not read back, are past a bound (kvbench.submissions.tables), or do not fit the table (a sample given
    twice, a malformed JSON field): each with the rule it breaks and why."""
    con = duckdb.connect()
    con.execute(table_ddl(SampleRecord, "samples", SAMPLE_KEY))
    bad = []
    budget = MAX_DECODED_BYTES
    for run in runs:
        for shard in run.shards:
            read = read_bounded_shard(shard, budget)
            if isinstance(read, OverBound):
                bad.append((shard, read.rule, read.message))
                continue
            if isinstance(read, str):
                bad.append((shard, "sample-counts", read))
                continue
            budget -= read.nbytes
            try:  # one shard at a time, so that a bad one is named and the others still load
                insert_rows(con, "samples", read)
            except duckdb.Error as exc:
                why = f"its samples do not fit the samples table ({str(exc).splitlines()[0]})"
                bad.append((shard, "sample-counts", why))
    return con, bad


def copy_samples(
    source: duckdb.DuckDBPyConnection,
    target: duckdb.DuckDBPyConnection,
    where: str,
    params: list[Any],
    run_id: str | None = None,
) -> None:
    """``source``'s samples that match ``where`` (kvbench's own SQL; the values are bound from ``params``)
    inserted into ``target``'s, under ``run_id`` where given (a board stores a submitted run under an id
    of its own). Through Arrow: DuckDB 2 names the call ``to_arrow_table``, earlier ``arrow``."""
    if run_id is None:
        relation = source.sql(f"SELECT * FROM samples WHERE {where}", params=params)
    else:
        relation = source.sql(
            f"SELECT * REPLACE (?::VARCHAR AS run_id) FROM samples WHERE {where}", params=[run_id, *params]
        )
    rows = relation.to_arrow_table() if hasattr(relation, "to_arrow_table") else relation.arrow()
    insert_rows(target, "samples", rows)

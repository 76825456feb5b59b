"""A board's database made anew from its ``submissions/`` folder (`kvbench accept --rebuild`): each kept
bundle's submission and runs as its record states them, in the order they were accepted, and each
published run of a live submission stored again from the runs the operator re-computed. Built beside
the old file, which it replaces only once complete. Kept bundles are not checked against the rules
again, only against their sha256 (their name)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from kvbench.errors import PrerequisiteError
from kvbench.store.atomic import atomic_write
from kvbench.store.board_tables import PUBLISHED, SUBMISSION_RUN_COLUMNS, SUBMISSION_TABLES
from kvbench.store.ingest import SCHEMA, insert_rows, publishing, transaction
from kvbench.submissions.accept import pending_runs
from kvbench.submissions.board import KEPT, SUBMISSION_COLUMNS, recomputed_folder
from kvbench.submissions.bundle import open_bundle, sha256_file
from kvbench.submissions.contents import load_samples, stored_runs
from kvbench.submissions.publish import store
from kvbench.submissions.rules import Checked


@dataclass(frozen=True)
class Rebuilt:
    submissions: int
    withdrawn: int
    runs: int
    snapshot: Path


def rebuild(database: Path) -> Rebuilt:
    """The board's database made anew from ``submissions/`` beside it."""
    folder = database.parent / KEPT
    with publishing(database) as snapshot:
        records = _records(folder)
        runs: list[int] = []
        atomic_write(database, lambda temp: runs.append(_replay(temp, database, records)))
    withdrawn = sum(r["withdrawn_at"] is not None for r in records)
    return Rebuilt(len(records), withdrawn, runs[0], snapshot)


def _records(folder: Path) -> list[dict[str, Any]]:
    """Every kept submission's record, in the order they were accepted; a bundle without its record (or
    a record without its bundle) is named."""
    bundles = {p.name.removesuffix(".tar.gz") for p in folder.glob("*.tar.gz")}
    paths = {p.stem: p for p in folder.glob("*.json")}
    unmatched = sorted(
        [
            f"{folder / name}.tar.gz: no record {name}.json beside it (accepted before kvbench kept "
            "records?): move it away, rebuild, then accept it again unless it was withdrawn"
            for name in bundles - set(paths)
        ]
        + [f"{paths[name]}: no bundle {name}.tar.gz beside it" for name in set(paths) - bundles]
    )
    records, bad = [], []
    for name in sorted(set(paths) & bundles):
        try:
            record = json.loads(paths[name].read_text())
            if not isinstance(record, dict) or record.get("bundle_sha256") != name:
                raise ValueError(f"not the record of submission {name}")
            missing = [k for k in SUBMISSION_COLUMNS if k not in record]
            if missing:
                raise ValueError(f"lacks {', '.join(missing)}")
            records.append(record)
        except (OSError, ValueError) as exc:
            bad.append(f"{paths[name]}: {exc}")
    if unmatched or bad or not bundles:
        raise PrerequisiteError(
            f"cannot rebuild from {folder}: "
            + ("\n  " + "\n  ".join(unmatched + bad) if unmatched or bad else "it holds no accepted bundle")
            + "\nEach accepted bundle is kept there as <sha256>.tar.gz with its record <sha256>.json."
        )
    return sorted(records, key=lambda r: (r["accepted_at"], r["bundle_sha256"]))


def _replay(temp: Path, database: Path, records: list[dict[str, Any]]) -> int:
    """Every record's submission, its runs' states and its published runs into the new database
    ``temp``; the runs stored."""
    temp.unlink()  # DuckDB creates its file itself
    folder = database.parent / KEPT
    with transaction(temp, SCHEMA + SUBMISSION_TABLES, "build it again") as con:
        for record in records:
            sha256 = record["bundle_sha256"]
            insert_rows(
                con, "submissions", pa.Table.from_pylist([{k: record[k] for k in SUBMISSION_COLUMNS}])
            )
            if "runs" in record:
                rows = [dict(zip(SUBMISSION_RUN_COLUMNS, row, strict=True)) for row in record["runs"]]
            else:  # a record from before runs were re-computed: every run waits for it again
                with _kept(folder / f"{sha256}.tar.gz") as checked:
                    rows = pending_runs(checked, sha256)
            if rows:
                insert_rows(con, "submission_runs", pa.Table.from_pylist(rows))
            if record["withdrawn_at"] is not None:
                continue
            for row in rows:
                if row["state"] == PUBLISHED:
                    store(con, recomputed_folder(database, sha256), row["computed_run"], row["run_id"])
        count = con.execute("SELECT count(*) FROM runs").fetchone()
    return count[0] if count else 0


@contextmanager
def _kept(bundle: Path) -> Iterator[Checked]:
    """A kept bundle's runs and samples, read as they are (its rules were checked when it was accepted,
    and its sha256 is still its name)."""
    if sha256_file(bundle) != bundle.name.removesuffix(".tar.gz"):
        raise PrerequisiteError(
            f"{bundle}: its sha256 is not its name, so it is not the bundle that was accepted; restore it "
            "from a backup (the board cannot be rebuilt without it)"
        )
    with tempfile.TemporaryDirectory() as scratch:
        failures = open_bundle(bundle, Path(scratch))
        runs, broken = stored_runs(Path(scratch) / "runs")
        samples, bad = load_samples(runs)
        with samples:
            problems = [str(f) for f in failures] + [f"runs/{b}: {why}" for b, why in broken.items()]
            problems += [f"{path}: {why}" for path, _, why in bad]
            if problems:
                raise PrerequisiteError(f"{bundle} no longer reads back: " + "; ".join(problems))
            yield Checked(None, runs=runs, samples=samples)

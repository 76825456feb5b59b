"""``kvbench check``: run a suite and hold every policy's results against the committed reference."""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Column, Table
from rich.text import Text

from kvbench.commands.common import console

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kvbench.results.check import CellResult, Finding
    from kvbench.runner.cell import Cell


def register(commands: argparse._SubParsersAction) -> None:
    check = commands.add_parser(
        "check", help="run a suite and compare it with the reference results in runs/reference/ (exit 0/1)"
    )
    check.add_argument("--suite", default="ci", help="suite name or YAML path (default: ci)")
    check.add_argument(
        "--reference",
        type=Path,
        default=Path("runs") / "reference",
        help="folder of reference results, one SUITE.json each (default: runs/reference)",
    )
    check.add_argument(
        "--out",
        type=Path,
        help="results folder: results already stored there are read, not recomputed "
        "(default: a fresh temporary folder, so that everything is recomputed)",
    )
    check.add_argument(
        "--update-reference", action="store_true", help="write these results as the new reference"
    )
    check.add_argument("--all", action="store_true", help="list unchanged cells too")
    check.add_argument("--quiet", action="store_true", help="no progress bar")
    check.set_defaults(func=check_command)


def _findings_table(findings: Sequence[Finding], title: str) -> Table:
    cell = Column("cell", no_wrap=True)  # whole, so that a log can be searched for it
    table = Table(cell, "reference [95% CI]", "now [95% CI]", "tolerance", "status", "detail", title=title)
    for f in findings:
        table.add_row(
            f.key,
            _estimate(f.reference),
            _estimate(f.now),
            "—" if f.tolerance is None else f"{f.tolerance:.4f}",
            Text(f.status, style="red") if f.fails else f.status,
            f.detail,
        )
    return table


def check_command(args: argparse.Namespace) -> int:
    from kvbench.errors import PrerequisiteError
    from kvbench.provenance import provenance
    from kvbench.results.check import (
        ReferenceManifest,
        compare_with_reference,
        read_reference,
        reference_path,
        write_reference,
    )
    from kvbench.runner.orchestrate import run_cells
    from kvbench.runner.plan import RunRequest, plan
    from kvbench.specs.suite import load_suite
    from kvbench.store.ingest import ingest

    suite = load_suite(args.suite)
    path = reference_path(args.reference, suite.name)
    if not args.update_reference and not path.is_file():
        raise PrerequisiteError(
            f"no reference results for suite {suite.name!r} at {path}: write them with "
            f"`kvbench check --suite {args.suite} --update-reference`"
        )
    # the suite's content, not its file: a reworded description does not invalidate the reference
    content = json.dumps(suite.model_dump(mode="json", exclude={"description"}), sort_keys=True)
    suite_sha256 = hashlib.sha256(content.encode()).hexdigest()
    if not args.update_reference:
        manifest, reference = read_reference(path)
        if manifest.suite_sha256 != suite_sha256:
            console.print(
                Text.assemble(
                    (f"suite {suite.name!r} changed since its reference was written", "red"),
                    f" ({(manifest.suite_sha256 or '?')[:12]} -> {suite_sha256[:12]}): the reference no "
                    f"longer describes it; review, then run `kvbench check --suite {args.suite} "
                    "--update-reference`",
                )
            )
            return 1
    cells = plan(RunRequest(suite=args.suite))
    with tempfile.TemporaryDirectory(prefix="kvbench-check-") as scratch:
        out = args.out or Path(scratch)
        completed = run_cells(cells, out, progress=not args.quiet)
        cells, timings = completed.cells, completed.timings
        snapshot = ingest(out).snapshot
        results = collect(cells, snapshot)
        print_verdicts(cells, snapshot)
    console.print(
        f"suite {suite.name}: {len(cells)} cells, {timings.computed} problems computed, "
        f"{timings.reused} read from {out}"
    )
    current = ReferenceManifest.model_validate(provenance())
    if args.update_reference:
        command = f"kvbench check --suite {args.suite} --update-reference"
        about = {"suite": suite.name, "suite_sha256": suite_sha256, "command": command}
        write_reference(path, results, current.model_copy(update=about))
        console.print(f"wrote the reference for {len(results)} cells to {path}")
        return 0
    findings = compare_with_reference(results, reference, manifest.environment_changes(current))
    shown = [f for f in findings if args.all or f.status != "same"]
    if shown:
        console.print(_findings_table(shown, f"kvbench check: suite {suite.name} against {path}"))
    failed = [f for f in findings if f.fails]
    same = sum(f.status == "same" for f in findings)
    console.print(
        f"{same} of {len(findings)} cells unchanged; {len(failed)} failing"
        + (f" ({', '.join(sorted({f.status for f in failed}))})" if failed else "")
        + f"; reference written {manifest.written} at commit {manifest.git.sha if manifest.git else None}"
    )
    return 1 if failed else 0


def print_verdicts(cells: list[Cell], snapshot: Path) -> None:
    """Every policy cell's verdict against its null, with the margin and the minimum detectable effect:
    what the suite's results say, beside whether they moved."""
    from kvbench.commands.run import build_report
    from kvbench.results.compare import effect_text, margin_text, verdict_text

    columns = (Column("cell", no_wrap=True), "Δ vs null [95% CI]", "W/T/L", "verdict", "margin / MDE")
    table = Table(*columns, title="verdicts against the null (Holm across each table's policies)")
    for cell, row in zip(cells, build_report(cells, snapshot), strict=True):
        if row["p_holm"] is None:  # the null, the full cache, or a policy without its null
            continue
        table.add_row(
            cell_key(cell),
            f"{row['delta']:+.4f} [{row['delta_low']:+.4f}, {row['delta_high']:+.4f}]",
            f"{row['wins']}/{row['ties']}/{row['losses']}",
            verdict_text(row),
            f"{margin_text(row['margin'])} / {effect_text(row['minimum_detectable_effect'])}",
        )
    if table.row_count:
        console.print(table)


def cell_key(cell: Cell) -> str:
    """model/task/protocol/policy{params}/role@K: how a cell is matched with its reference."""
    params = json.dumps(cell.policy.params(), sort_keys=True, default=str, separators=(",", ":"))
    # the full cache serves every K unless its scores depend on K (fidelity): then it carries its K
    budget = "full" if cell.spec.budget is None else str(cell.budget)
    where = f"{cell.model.name}/{cell.task.name}/{cell.protocol.name}"
    return f"{where}/{cell.policy.name}{params}/{cell.role}@{budget}"


def code_hash(cell: Cell) -> str:
    """sha256 of the policy's source file: outputs that change with the same code are a regression."""
    source = Path(inspect.getfile(type(cell.policy)))
    return hashlib.sha256(source.read_bytes()).hexdigest()[:16]


def collect(cells: list[Cell], database: Path) -> list[CellResult]:
    """Every cell's result from the database; a cell without samples is an error (it did not run). Here,
    beside the runner's cells, so that results never import the runner."""
    from kvbench.errors import PrerequisiteError
    from kvbench.results.check import CellResult, outputs_digest
    from kvbench.results.pairing import partners
    from kvbench.results.stats import bootstrap_mean
    from kvbench.results.summary import summarize
    from kvbench.specs.resolved import Role
    from kvbench.store.ingest import reading

    with reading(database) as con:
        summaries = summarize(con, [c.run_id for c in cells])
        results = []
        for cell in cells:
            summary = summaries[cell.run_id]
            if not summary.samples:
                raise PrerequisiteError(f"{cell.label} (run {cell.run_id}) has no samples in {database}")
            score = bootstrap_mean(list(summary.scores.values()))
            paired: list[str | None] = [None, None]  # a policy cell's null and full cache, by key
            if cell.role == Role.POLICY:
                paired = [cell_key(c) if c is not None else None for c in partners(cell.spec, cells).values()]
            results.append(
                CellResult(
                    cell_key(cell),
                    cell.run_id,
                    score.value,
                    score.low,
                    score.high,
                    summary.scores,
                    outputs_digest(con, cell.run_id),
                    code_hash(cell),
                    *paired,
                )
            )
        return results


def _estimate(result) -> str:
    if result is None:
        return "—"
    return f"{result.score:.4f} [{result.low:.4f}, {result.high:.4f}]"

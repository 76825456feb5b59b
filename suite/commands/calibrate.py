"""``kvbench calibrate-null``: the null against itself (A/A) at other protocol seeds, to measure the
verdicts' real error rates.

The suite is planned as ``kvbench run`` plans it, once per protocol seed; only the null and the full cache
(which the null's budget and the probes' scores need) are kept. A seed is part of a run's identity, so
every replicate is a run of its own, run and stored by the ordinary runner. The null at seeds s0 + 2i and
s0 + 2i + 1 (s0 the protocol's seed, so the first pair includes the real null) is one A/A comparison per
(model, task, budget): disjoint pairs, so that the comparisons are independent.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from kvbench.commands.common import console, output_file, output_folder

if TYPE_CHECKING:
    from kvbench.results.stats import PairedComparison
    from kvbench.runner.cell import Cell


def register(commands: argparse._SubParsersAction) -> None:
    # `kvbench calibrate` already names TriAttention's query statistics (kvbench.commands.models)
    calibrate = commands.add_parser(
        "calibrate-null", help="run the null against itself at other seeds: how often each verdict comes out"
    )
    calibrate.add_argument("--suite", default="quick", help="suite name or YAML path (default: quick)")
    calibrate.add_argument("--model", action="append", default=[], help="only this model (repeatable)")
    calibrate.add_argument("--task", action="append", default=[], help="only this task (repeatable)")
    calibrate.add_argument("--limit", type=int, help="problems per task (default: the suite's)")
    calibrate.add_argument(
        "--pairs", type=int, default=10, help="A/A pairs of seeds per cell (default: 10, i.e. 20 seeds)"
    )
    calibrate.add_argument("--out", type=Path, default=Path("runs") / "calibration")
    calibrate.add_argument("--json", type=Path, help="also write the tally and every comparison here")
    calibrate.add_argument("--quiet", action="store_true", help="no progress bar")
    calibrate.set_defaults(func=calibrate_command)


def calibrate_command(args: argparse.Namespace) -> int:
    from kvbench.errors import SpecError
    from kvbench.results.stats import calibration
    from kvbench.runner.orchestrate import run_cells
    from kvbench.store.atomic import atomic_write
    from kvbench.store.ingest import ingest

    if args.pairs < 1:
        raise SpecError(f"--pairs {args.pairs}: give at least 1 pair of seeds")
    output_folder(args.out, "--out")
    if args.json:
        output_file(args.json, "--json")  # before the runs, not after them
    cells = replicate_cells(args)
    completed = run_cells(cells, args.out, progress=not args.quiet)
    tally = aa_comparisons(completed.cells, ingest(args.out).snapshot)
    result = calibration([c for _, c in tally])
    print_calibration(result)
    if args.json:
        document = {
            "calibration": asdict(result),
            "comparisons": [{"cell": label, **asdict(c)} for label, c in tally],
        }
        text = json.dumps(document, indent=1, default=str) + "\n"
        atomic_write(args.json, lambda temp: temp.write_text(text))
    return 0


def replicate_cells(args: argparse.Namespace) -> list[Cell]:
    """The suite's null cells at 2 × pairs protocol seeds from the protocol's own, with the full-cache
    cells that their K waits on (a measured N_avg); a probe's K is fixed, and no A/A comparison reads
    the full cache, so a probe's is not run."""
    from kvbench.runner.plan import RunRequest, plan
    from kvbench.specs.resolved import Role

    def request(seed: int | None) -> RunRequest:
        return RunRequest(
            suite=args.suite, models=tuple(args.model), tasks=tuple(args.task), limit=args.limit, seed=seed
        )

    first = plan(request(None))
    start = first[0].protocol.seed
    cells: list[Cell] = []
    for seed in range(start, start + 2 * args.pairs):
        planned = first if seed == start else plan(request(seed))
        nulls = [c for c in planned if c.role == Role.NULL]
        awaited = {c.pending.reference_run for c in nulls if c.pending is not None}
        cells += nulls + [c for c in planned if c.role == Role.REFERENCE and c.run_id in awaited]
    return list({c.run_id: c for c in cells}.values())


def aa_comparisons(cells: list[Cell], database: Path) -> list[tuple[str, PairedComparison]]:
    """Each (model, task, budget)'s null at seeds s0 + 2i against s0 + 2i + 1, judged on its own."""
    from kvbench.results.stats import compare_arms, verdicts
    from kvbench.results.summary import summarize
    from kvbench.specs.resolved import Role
    from kvbench.store.ingest import reading

    nulls = [c for c in cells if c.role == Role.NULL]
    with reading(database) as con:
        summaries = summarize(con, [c.run_id for c in nulls])
    by_cell: dict[tuple[str, str, int | None], list[Cell]] = {}
    for cell in sorted(nulls, key=lambda c: c.protocol.seed):
        by_cell.setdefault((cell.model.name, cell.task.name, cell.budget), []).append(cell)
    out = []
    for (model, task, budget), seeds in by_cell.items():
        for a, b in zip(seeds[::2], seeds[1::2], strict=False):
            scores = summaries[a.run_id].scores, summaries[b.run_id].scores
            (judged,) = verdicts([compare_arms(*scores, a.protocol.margin)])
            out.append((f"{model}/{task}@{budget} seeds {a.protocol.seed}-{b.protocol.seed}", judged))
    return out


def print_calibration(result) -> None:
    table = Table(title=f"A/A calibration: the null against itself, {result.comparisons} pairs of seeds")
    for column in ("verdict", "count", "share"):
        table.add_column(column)
    for verdict, count in result.verdicts.items():
        table.add_row(verdict, str(count), f"{count / max(result.comparisons, 1):.1%}")
    console.print(table)
    console.print(
        f"false-positive rate (beats or loses to itself): {result.false_positive_rate:.1%} "
        f"[95% Clopper-Pearson {result.low:.1%}, {result.high:.1%}] over {result.comparisons} comparisons "
        f"(α = 5%); paired 95% intervals covering 0: {result.covered:.1%}"
    )

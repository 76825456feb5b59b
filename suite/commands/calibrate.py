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
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from kvbench.commands.common import console, output_file, output_folder

if TYPE_CHECKING:
    from kvbench.results.aa import Exchangeability, ShiftCalibration
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
    from kvbench.results.aa import injected_shift, seed_exchangeability
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
    groups = null_seeds(completed.cells, ingest(args.out).snapshot)
    tally = aa_comparisons(groups)
    result = calibration([c for _, c in tally])
    exchange = seed_exchangeability({label: g.scores for label, g in groups.items()})
    # the same A/A pairs, each with its cell's margin, one arm moved by it
    pairs = [(g.scores[a], g.scores[b], g.margin) for g in groups.values() for a, b in g.pairs()]
    shift = injected_shift(pairs)
    print_calibration(result)
    print_checks(exchange, shift)
    if args.json:
        document = {
            "calibration": asdict(result),
            "exchangeability": asdict(exchange),
            "injected_shift": asdict(shift),
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


@dataclass(frozen=True)
class NullSeeds:
    """One (model, task, budget) cell's null at every seed, in seed order, and its equivalence margin."""

    seeds: list[int]
    scores: list[dict[str, float]]
    """Per seed: problem id -> score."""
    margin: float

    def pairs(self) -> list[tuple[int, int]]:
        """Indices of the disjoint A/A pairs: seeds s0 + 2i against s0 + 2i + 1."""
        return [(i, i + 1) for i in range(0, len(self.seeds) - 1, 2)]


def null_seeds(cells: list[Cell], database: Path) -> dict[str, NullSeeds]:
    """Cell label ("model/task@K") -> its null's scores at each seed."""
    from kvbench.results.summary import summarize
    from kvbench.specs.metric_kind import equivalence_margin
    from kvbench.specs.resolved import Role
    from kvbench.store.ingest import reading

    nulls = [c for c in cells if c.role == Role.NULL]
    with reading(database) as con:
        summaries = summarize(con, [c.run_id for c in nulls])
    found: dict[str, NullSeeds] = {}
    for cell in sorted(nulls, key=lambda c: c.protocol.seed):
        label = f"{cell.model.name}/{cell.task.name}@{cell.budget}"
        margin = equivalence_margin(cell.task, cell.protocol).value
        group = found.setdefault(label, NullSeeds([], [], margin))
        group.seeds.append(cell.protocol.seed)
        group.scores.append(summaries[cell.run_id].scores)
    return found


def aa_comparisons(groups: dict[str, NullSeeds]) -> list[tuple[str, PairedComparison]]:
    """Each cell's null at seeds s0 + 2i against s0 + 2i + 1, judged on its own."""
    from kvbench.results.stats import compare_arms, verdicts

    out = []
    for label, group in groups.items():
        for a, b in group.pairs():
            (judged,) = verdicts([compare_arms(group.scores[a], group.scores[b], group.margin)])
            out.append((f"{label} seeds {group.seeds[a]}-{group.seeds[b]}", judged))
    return out


def print_calibration(result) -> None:
    title = f"A/A calibration: the null against itself, {result.comparisons} pairs of seeds"
    table = Table("verdict", "count", "share", title=title)
    for verdict, count in result.verdicts.items():
        table.add_row(verdict, str(count), f"{count / max(result.comparisons, 1):.1%}")
    console.print(table)
    if result.testable:
        console.print(
            f"false-positive rate (a decided difference from itself): {result.false_positive_rate:.1%} "
            f"[95% Clopper-Pearson {result.low:.1%}, {result.high:.1%}] over {result.testable} of "
            f"{result.comparisons} comparisons, those that can reject (α = 5%; their exact attainable "
            f"levels sum to {result.expected:.2f} expected false positives)"
        )
    else:
        console.print(
            f"false-positive rate: not measured; none of the {result.comparisons} comparisons can reject "
            "(fewer than 6 problems differ in each)"
        )
    if math.isnan(result.covered):
        console.print("shown 95% intervals covering 0: not measured (no problem differs in any comparison)")
    else:
        console.print(f"shown 95% intervals covering 0 where some problem differs: {result.covered:.1%}")


def print_checks(exchange: Exchangeability, shift: ShiftCalibration) -> None:
    """The pooled exchangeability test of the null's seeds and the equivalence test's level at an injected
    shift, each with what it rests on."""
    if math.isnan(exchange.p_value):
        console.print("seeds exchangeable: not tested (no problem's null score differs between seeds)")
    else:
        console.print(
            f"seeds exchangeable (pooled permutation test over {len(exchange.cells)} cell(s), up to "
            f"{exchange.seeds} seeds each, {exchange.draws:,} shuffles): p = {exchange.p_value:.3f}"
        )
    if not shift.comparisons:
        console.print(
            f"equivalence at a shift of one margin: not measured; none of the {shift.left_out} pairs has "
            "a margin and enough problems to declare equivalence (30 for a continuous metric, 149 for "
            "pass/fail at ±0.02)"
        )
        return
    console.print(
        f"equivalence at a shift of one margin (at most 5% where the test holds its level): "
        f"{shift.equivalent} of {shift.comparisons} pairs, {shift.rate:.1%} [95% Clopper-Pearson "
        f"{shift.low:.1%}, {shift.high:.1%}]"
        + (f"; {shift.left_out} pairs could not be counted" if shift.left_out else "")
    )

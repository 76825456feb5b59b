"""``kvbench run``, ``kvbench validate`` and ``kvbench ingest``."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from kvbench.commands.common import (
    add_executor_arguments,
    add_scorer_memory_argument,
    add_threads_argument,
    console,
    executor_from,
    from_flags,
    output_file,
    output_folder,
    printable,
    use_threads,
    warn_if_busy,
)
from kvbench.commands.memory import (
    PROMPT_TOKENS,
    add_memory_arguments,
    memory_limits,
    plan_only,
    print_plan,
)
from kvbench.specs.protocol import NULL_POLICY
from kvbench.specs.resolved import Role

if TYPE_CHECKING:
    from kvbench.results.comparison import ArmResult
    from kvbench.runner.plan import Cell, RunRequest


def register(commands: argparse._SubParsersAction) -> None:
    _register_run(commands)
    validate = commands.add_parser("validate", help="check specs without running them")
    validate.add_argument(
        "path", nargs="?", type=Path, help="a YAML file or folder (default: every built-in spec)"
    )
    validate.set_defaults(func=validate_command)

    grade = commands.add_parser("grade", help="grade a run's stored outputs again, without regenerating")
    grade.add_argument("run", help="run id (or a unique prefix), as in runs/shards/")
    grade.add_argument("--out", type=Path, default=Path("runs"))
    grade.add_argument("--allow-code-execution", action="store_true")
    grade.set_defaults(func=grade_command)

    _register_compare(commands)
    ingest = commands.add_parser("ingest", help="merge result shards into the DuckDB file")
    ingest.add_argument("--out", type=Path, default=Path("runs"))
    ingest.add_argument(
        "--rebuild",
        action="store_true",
        help="build the database again from every shard (after a schema change); the old one is replaced "
        "only once the new one is complete",
    )
    ingest.set_defaults(func=ingest_command)


def _register_run(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser(
        "run", help="run a suite: policies against the Random Attention null and the full cache"
    )
    run.add_argument("--policy", action="append", default=[], help="policy under test (repeatable)")
    run.add_argument("--protocol", help="protocol name or YAML path (default: the suite's)")
    run.add_argument("--suite", default="quick", help="suite name or YAML path (default: quick)")
    run.add_argument("--task", action="append", default=[], help="task name or YAML path (repeatable)")
    run.add_argument("--model", action="append", default=[], help="model name or YAML path (repeatable)")
    budget = run.add_mutually_exclusive_group()
    budget.add_argument("--budget", type=int, help="a fixed K for every task")
    budget.add_argument("--ratio", type=float, help="K = N_avg / ratio (default: the protocol's)")
    run.add_argument("--samples", type=int, help="samples per problem (default: the task's)")
    run.add_argument("--max-new-tokens", type=int, help="cap on generated tokens (default: the task's)")
    run.add_argument(
        "--allow-code-execution",
        action="store_true",
        help="let code tasks run model-written programs in the sandbox",
    )
    run.add_argument("--limit", type=int, help="at most this many problems per task")
    run.add_argument("--seed", type=int, help="the protocol seed (default: the protocol's)")
    run.add_argument("--out", type=Path, default=Path("runs"), help="results folder (default: runs)")
    run.add_argument(
        "--data", type=Path, help="a local copy of the one --task's dataset, in the hub's layout"
    )
    run.add_argument(
        "--adapter",
        default="hf",
        help="backend, by name (hf: transformers; vllm: a vLLM engine; plugins add more)",
    )
    run.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (the kind is part of the identity)")
    run.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        help="override the model spec's dtype (default: the spec's)",
    )
    run.add_argument(
        "--attention",
        default="sdpa",
        help="the attention implementation kvbench's attention wraps (default: sdpa)",
    )
    run.add_argument("--no-baselines", action="store_true", help="skip the null and full-cache arms")
    run.add_argument(
        "--isolate",
        action="store_true",
        help="run scorers from files (FILE.py:Class) in a process of their own behind the sandbox; "
        "kvbench verify always does",
    )
    run.add_argument(
        "--scorer-seconds",
        type=float,
        default=60.0,
        help="with --isolate: an isolated scorer's time limit per call (each event, and loading its file) "
        "and the CPU seconds its processes may use per call (default: 60)",
    )
    add_scorer_memory_argument(run)
    add_executor_arguments(run)
    add_threads_argument(run)
    add_memory_arguments(run)
    run.add_argument("--json", type=Path, help="also write the final table to this file")
    add_wide_argument(run)
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=run_command)


def _register_compare(commands: argparse._SubParsersAction) -> None:
    cmp = commands.add_parser("compare", help="every stored policy against the null, with verdicts")
    cmp.add_argument(
        "--db",
        type=Path,
        default=Path("runs") / "kvbench.snapshot.duckdb",
        help="database to read (default: the published snapshot in runs/)",
    )
    cmp.add_argument("--model")
    cmp.add_argument("--task")
    cmp.add_argument("--protocol")
    cmp.add_argument("--budget", type=int)
    cmp.add_argument(
        "--against", default=NULL_POLICY, help=f"the baseline policy (default: {NULL_POLICY}, the null)"
    )
    cmp.add_argument("--seed", type=int, help="only runs under this protocol seed (default: every seed)")
    cmp.add_argument(
        "--pool",
        action="append",
        default=[],
        metavar="NAME=TASK,TASK",
        help="also compare these tasks pooled, clustered by (task, problem) (repeatable)",
    )
    cmp.add_argument(
        "--metric",
        choices=["score", "answer-logprob", "needle-survival", "needle-whole-layers"],
        default="score",
        help="rank and pair arms by the task's metric (default), or on needle probes by the answer's "
        "log-probability, the share of the needle kept, or the share of layers holding all of it",
    )
    cmp.add_argument(
        "--family",
        choices=["table", "sweep"],
        default="table",
        help="what each Holm correction runs over: the policies of one table (one task at one budget; "
        "default), or every task and budget of one model, protocol, runtime and seed together (a sweep); "
        "pooled tables form a family of their own either way",
    )
    cmp.add_argument("--format", choices=["table", "json", "csv", "markdown"], default="table")
    add_wide_argument(cmp)
    cmp.set_defaults(func=compare_command)


def add_wide_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wide",
        action="store_true",
        help="every field (W/T/L, margin and MDE, token costs, Δ vs full): one table where the terminal is "
        "wide enough, else a block per policy; the default table fits 100 columns, and --format "
        "json/csv/markdown always has every field",
    )


def run_command(args: argparse.Namespace) -> int:
    from kvbench.runner.orchestrate import run_cells
    from kvbench.runner.plan import plan
    from kvbench.store.atomic import atomic_write
    from kvbench.store.ingest import ingest

    output_folder(args.out, "--out")  # before any work: a folder that cannot take the results fails now
    if args.threads is not None and args.executor == "ray":
        from kvbench.errors import SpecError

        raise SpecError("--threads sets this process's threads; a Ray replica's are --ray-cpus-per-worker")
    use_threads(args.threads)
    limits = memory_limits(args)
    if args.json:
        output_file(args.json, "--json")
    started = time.perf_counter()
    cells = plan(run_request(args))
    if args.plan_only:
        return plan_only(cells, limits, args.prompt_tokens or PROMPT_TOKENS)
    executor = executor_from(args, args.out)
    if executor is None:  # Ray's replicas have their own threads (--ray-cpus-per-worker)
        warn_if_busy(args.threads, args.device)
    completed = run_cells(
        cells, args.out, executor, progress=not args.quiet, memory=limits, show_plan=print_plan
    )
    cells, timings = completed.cells, completed.timings
    ingest_started = time.perf_counter()
    report = ingest(args.out)
    timings.ingest = time.perf_counter() - ingest_started
    rows = build_report(cells, report.snapshot)
    for model, task in dict.fromkeys((c.model.name, c.task.name) for c in cells):
        group = [c for c in cells if (c.model.name, c.task.name) == (model, task)]
        shown = [row for row in rows if (row["model"], row["task"]) == (model, task)]
        print_table(group, shown, wide=args.wide)
        print_measured_n_avg(group)
    print_task_groups(args, cells, rows, report.snapshot)
    wall = time.perf_counter() - started
    console.print(
        f"{timings.computed} problems computed, {timings.reused} reused; wall {wall:.1f} s (model load "
        f"{timings.model_load:.1f} s, calibration {timings.calibration:.1f} s, scoring {timings.units:.1f} s "
        f"of which evicting {timings.eviction:.1f} s, ingest {timings.ingest:.1f} s)"
    )
    console.print(f"results: {report.database} (tables runs, samples); shards: {args.out / 'shards'}")
    if args.json:
        text = json.dumps({"rows": rows, "wall_seconds": wall}, indent=2, default=str)
        atomic_write(args.json, lambda temp: temp.write_text(text))
    return 0


def run_request(args: argparse.Namespace) -> RunRequest:
    """The command line as the planner's request: each field from the flag of its name, or as below."""
    from kvbench.runner.plan import RunRequest

    return from_flags(
        RunRequest,
        args,
        policies=tuple(args.policy),
        tasks=tuple(args.task),
        models=tuple(args.model),
        baselines=not args.no_baselines,
        data=str(args.data.resolve()) if args.data else None,
    )


def build_report(cells: Sequence[Cell], database: Path) -> list[dict]:
    """One comparison row (kvbench.results.compare's COLUMNS, with the role) per cell, in the cells' order;
    each (model, task, budget) is one table of the builder. Here, beside the runner's cells, so that
    results never import the runner."""
    from kvbench.results.compare import arm_row
    from kvbench.results.comparison import compare_table, stored_runs
    from kvbench.results.summary import summarize
    from kvbench.store.ingest import reading

    with reading(database) as con:
        runs = {r.run_id: r for r in stored_runs(con, run_ids=[c.run_id for c in cells])}
        summaries = summarize(con, list(runs))
    results: dict[str, ArmResult] = {}
    tables: dict[tuple[str, str, int | None], None] = dict.fromkeys(
        (c.model.name, c.task.name, c.budget) for c in cells if c.role != Role.REFERENCE
    )
    # a full cache run without policies beside it is a table of its own
    tables.update(dict.fromkeys((c.model.name, c.task.name, None) for c in cells if c.role == Role.REFERENCE))
    for model, task, budget in tables:
        table = [
            runs[c.run_id]
            for c in cells
            if (c.model.name, c.task.name) == (model, task)
            and (c.role == Role.REFERENCE or (budget is not None and c.budget == budget))
        ]
        for arm in compare_table(table, summaries, tasks=(task,)):
            run = arm.runs[task]
            if run.role != Role.REFERENCE or run.run_id not in results:  # the full cache: its first table
                results[run.run_id] = arm
    rows = []
    for cell in cells:
        arm = results[cell.run_id]
        # the full cache runs at no K: its row shows none
        budget, ratio = (None, None) if cell.role == Role.REFERENCE else (cell.budget, cell.ratio)
        row = arm_row(runs[cell.run_id].context, budget, ratio, arm, pooled=False)
        rows.append({**row, "role": cell.role, "verdict": arm.verdict})
    return rows


def print_table(cells: list[Cell], rows: list[dict], *, wide: bool = False) -> None:
    """One model and task: every arm against the null and the full cache, then the sign test's power."""
    from kvbench.results.stats import resolvable_difference

    head = cells[0]
    about = f"{head.task.name} on {head.model.name} ({head.task.metric}"
    if wide:
        title = f"{about}, higher is better; 95% CI over problems)"
    else:
        k = ", ".join(str(b) for b in sorted({c.budget for c in cells if c.role != Role.REFERENCE}))
        title = f"{about}; K = {k}; Δ vs the null; 95% CI over problems)"
    print_rows(rows, title, wide=wide)
    problems = rows[0]["problems"]
    console.print(
        f"power note: with {problems} problems a sign test detects (80% power, 5% level) only policies "
        f"that win at least {0.5 + resolvable_difference(problems):.0%} of the problems they do not tie"
    )


def print_measured_n_avg(group: list[Cell]) -> None:
    """Where K came from when it followed the full cache's measured N_avg."""
    measured = [c.spec.n_avg_measurement for c in group if c.spec.n_avg_measurement is not None]
    for m in dict.fromkeys(measured):
        declared = "none" if m.declared is None else f"{m.declared:g}"
        console.print(
            f"K = N_avg/ratio with N_avg = {m.measured:.1f} tokens, the full cache's mean generated "
            f"length over {m.problems} problems ({m.samples} samples; run {m.reference_run}); "
            f"the task's declared estimate: {declared}"
        )


def print_task_groups(args: argparse.Namespace, cells: list[Cell], rows: list[dict], snapshot: Path) -> None:
    """The suite's declared task groups (e.g. AIME 2025 + 2026), pooled, when the whole suite ran."""
    from kvbench.results.compare import Filters, compare
    from kvbench.specs.suite import load_suite

    suite = load_suite(args.suite)
    if not suite.groups or args.task:
        return
    pools = tuple((name, tuple(tasks)) for name, tasks in suite.groups.items())
    for model in dict.fromkeys(r["model"] for r in rows):
        filters = Filters(
            model=model, protocol=cells[0].protocol.name, pools=pools, seed=cells[0].protocol.seed
        )
        pooled = [r for r in compare(snapshot, filters) if r["task"] in suite.groups]
        if pooled:
            title = f"pooled task groups on {model} (clustered by task and problem)"
            print_comparison(pooled, title, wide=args.wide)


def validate_command(args: argparse.Namespace) -> int:
    from kvbench.runner.sources import resolved_task
    from kvbench.specs.validate import validate_paths

    checked = validate_paths(args.path, check_task=resolved_task)
    for kind, name in checked:
        print(f"ok\t{kind}\t{printable(name)}")
    return 0


def grade_command(args: argparse.Namespace) -> int:
    from kvbench.runner.regrade import regrade
    from kvbench.store.ingest import ingest

    output_folder(args.out, "--out")
    report = regrade(args.out, args.run, allow_code_execution=args.allow_code_execution)
    ingest(args.out)
    print(f"re-graded {report.samples} samples of run {report.run_id}: {report.changed} verdicts changed")
    return 0


def compare_command(args: argparse.Namespace) -> int:
    from kvbench.errors import PrerequisiteError
    from kvbench.results.compare import Filters, compare, render

    if not args.db.is_file():
        raise PrerequisiteError(
            f"no results database at {args.db}: run `kvbench run` (or `kvbench ingest`) first"
        )
    pools = tuple(_parse_pool(text) for text in args.pool)
    filters = from_flags(Filters, args, pools=pools, quantity=args.metric)
    rows = compare(args.db, filters)
    if args.format != "table":
        print(printable(render(rows, args.format), lines=True))  # JSON escapes them itself
        return 0
    if not rows:
        console.print("no stored policy matches these filters with a baseline run beside it")
        return 0
    measured = "" if args.metric == "score" else f" by {args.metric}"
    print_comparison(
        rows,
        f"policies against {args.against}{measured} (α = 0.05, Holm-corrected over the family named under "
        "each table)",
        wide=args.wide,
    )
    return 0


def print_comparison(rows: list[dict], title: str, *, wide: bool = False) -> None:
    """Every row in one table of HEADER's columns (``wide``), else a compact table per model, task and
    runtime, with what an inconclusive row would need printed under it."""
    if wide:
        print_rows(rows, title, wide=True)
        return
    console.print(title)
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["task"], r["protocol"], r["runtime"], r["seed"]), []).append(r)
    for (model, task, protocol, runtime, seed), group in groups.items():
        print_rows(group, f"{task} on {model} · {protocol} · {runtime} seed {seed}")


def print_rows(rows: list[dict], title: str, *, wide: bool = False) -> None:
    """Comparison rows: every field (``wide``: wide_view), else one table of COMPACT_HEADER's columns with
    what an inconclusive row would need printed under it."""
    from kvbench.commands.wide_table import wide_view
    from kvbench.results.compare import COMPACT_HEADER, compact_cells, power_notes

    if wide:
        console.print(wide_view(rows, printable(title), console))
        return
    # names, tasks and models may come from a bundle: escaped before the table measures its cells
    table = Table(title=printable(title))
    for column in COMPACT_HEADER:
        table.add_column(column, justify="left" if column in ("policy", "verdict (Holm p)") else "right")
    for r in rows:
        table.add_row(*map(printable, compact_cells(r)))
    console.print(table)
    for note in power_notes(rows):
        console.print(printable(note))


def _parse_pool(text: str) -> tuple[str, tuple[str, ...]]:
    from kvbench.errors import SpecError

    name, _, tasks = text.partition("=")
    members = tuple(t.strip() for t in tasks.split(",") if t.strip())
    if not name or len(members) < 2:
        raise SpecError(
            f"--pool {text!r}: write NAME=TASK,TASK[,...] with two or more tasks, e.g. aime=aime25,aime26"
        )
    repeated = sorted({t for t in members if members.count(t) > 1})
    if repeated:
        raise SpecError(f"--pool {text!r}: task(s) {', '.join(repeated)} listed twice; list each task once")
    return name, members


def ingest_command(args: argparse.Namespace) -> int:
    from kvbench.store.ingest import ingest

    output_folder(args.out, "--out")
    report = ingest(args.out, rebuild=args.rebuild)
    print(f"ingested {report.files} new shard files from {report.runs} runs into {report.database}")
    return 0

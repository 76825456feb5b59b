"""``kvbench export``, ``accept``, ``verify`` and ``withdraw``: results from many machines onto one board.

A submitter packs runs with `kvbench export`; a leaderboard maintainer checks and records the bundle
with `kvbench accept BUNDLE --db PATH` (its runs pending), re-computes every run of it with `kvbench
verify DIGEST --db PATH` (each run computed whole is published with the maintainer's numbers), and can
take it back with `kvbench withdraw`. The rules are in kvbench.submissions.rules.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from kvbench.commands.common import (
    add_executor_arguments,
    add_scorer_memory_argument,
    console,
    executor_from,
    output_file,
    output_folder,
    printable,
)
from kvbench.commands.memory import PROMPT_TOKENS, add_memory_arguments, memory_limits, plan_only, print_plan
from kvbench.errors import SpecError
from kvbench.store.atomic import atomic_write

if TYPE_CHECKING:
    from kvbench.submissions.rules import Checked


def register(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export", help="pack runs (with their null and full-cache runs) into a bundle"
    )
    export.add_argument("bundle", type=Path, help="the bundle file to write (e.g. my-scorer.kvbench.tar.gz)")
    export.add_argument("--out", type=Path, default=Path("runs"), help="results folder (default: runs)")
    export.add_argument("--run", action="append", default=[], help="a run id or unique prefix (repeatable)")
    export.add_argument("--policy", action="append", default=[], help="every run of a policy (repeatable)")
    export.add_argument(
        "--scorer",
        type=Path,
        action="append",
        default=[],
        help="source file of a policy that is not built in (repeatable)",
    )
    export.add_argument("--suite", help="the suite of runs made before kvbench recorded it")
    export.add_argument("--submitter", default="", help="who submits (name, group, contact)")
    export.add_argument("--description", default="", help="what the submission is")
    export.set_defaults(func=export_command)

    accept = commands.add_parser("accept", help="check a bundle against every rule and add it to a board")
    accept.add_argument("bundle", type=Path, nargs="?", help="the bundle (none with --rebuild)")
    accept.add_argument("--db", type=Path, required=True, help="the leaderboard's DuckDB file")
    accept.add_argument("--by", help="who accepts it (default: this user)")
    accept.add_argument(
        "--rebuild",
        action="store_true",
        help="build the board's database again from the bundles it accepted (kept in submissions/ beside "
        "it, with their records and the runs re-computed there); the old file is replaced only once the new "
        "one is complete",
    )
    accept.set_defaults(func=accept_command)

    verify = commands.add_parser(
        "verify",
        help="re-compute every run of a bundle here, whole; with --db, publish each run computed whole "
        "(exit 1 if a run failed, 3 if one still waits for --data)",
    )
    verify.add_argument(
        "bundle", help="the bundle file, or with --db the sha256 (8 digits or more) of a submission it holds"
    )
    verify.add_argument(
        "--db", type=Path, help="the leaderboard's database: publish what is re-computed there"
    )
    verify.add_argument(
        "--work",
        type=Path,
        help="where to compute (default: with --db, submissions/<sha256>.recomputed beside it, which a "
        "re-run resumes from; without, a temporary folder)",
    )
    verify.add_argument(
        "--retry",
        action="store_true",
        help="with --db: compute again, from nothing, the runs whose re-computation failed (a failed run "
        "counts only once computed whole)",
    )
    verify.add_argument("--device", help="re-compute on another device than the runs recorded")
    verify.add_argument("--attention", help="re-compute with another attention implementation")
    verify.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="TASK=PATH",
        help="a local copy of a task's data, for runs made with --data",
    )
    verify.add_argument("--json", type=Path, help="also write the outcomes to this JSON file")
    verify.add_argument(
        "--scorer-seconds",
        type=float,
        default=60.0,
        help="a submitted scorer (always isolated): its time limit per call (each event, and loading its "
        "file) and the CPU seconds its processes may use per call (default: 60)",
    )
    verify.add_argument(
        "--scorer-run-seconds",
        type=float,
        default=3600.0,
        help="a submitted scorer: the time all of one run's calls may take together, its loading included "
        "(default: 3600)",
    )
    add_scorer_memory_argument(verify)
    add_executor_arguments(verify)
    add_memory_arguments(verify)
    verify.add_argument("--quiet", action="store_true", help="no progress bar")
    verify.set_defaults(func=verify_command)

    withdraw = commands.add_parser("withdraw", help="take an accepted submission off a board")
    withdraw.add_argument("digest", help="the bundle's sha256 or a unique prefix")
    withdraw.add_argument("--db", type=Path, required=True)
    withdraw.add_argument("--reason", required=True, help="why (kept with the record)")
    withdraw.set_defaults(func=withdraw_command)


def export_command(args: argparse.Namespace) -> int:
    from kvbench.submissions.export import export

    done = export(
        args.out,
        args.bundle,
        run_ids=args.run,
        policies=args.policy,
        scorers=args.scorer,
        suite=args.suite,
        submitter=args.submitter,
        description=args.description,
    )
    console.print(
        f"{done.path}: {done.runs} runs, {done.samples} samples, {done.size:,} bytes, sha256 {done.sha256}"
    )
    return 0


@dataclass(frozen=True)
class _Opened:
    copy: Path
    """A private copy of the bundle: what was hashed is what was checked, and what is kept."""
    sha256: str
    folder: Path
    checked: Checked


@contextmanager
def _checked(bundle: Path) -> Iterator[_Opened]:
    from kvbench.submissions.bundle import open_bundle, sha256_file
    from kvbench.submissions.rules import Checked, check_bundle

    if not bundle.is_file():
        raise SpecError(f"no bundle file {bundle}")
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        copy, folder = scratch / "bundle.tar.gz", scratch / "members"
        shutil.copyfile(bundle, copy)
        folder.mkdir()
        failures = open_bundle(copy, folder)
        checked = Checked(None, failures=failures) if failures else check_bundle(folder)
        yield _Opened(copy, sha256_file(copy), folder, checked)


REFUSALS_SHOWN = 50
"""The broken rules a refusal lists; the count says how many there are in all."""


def _refused(bundle: Path, failures: list) -> int:
    console.print(
        Text.assemble(
            (f"{bundle}: refused", "bold red"), f", {len(failures)} rule(s) broken; nothing was written:"
        ),
        highlight=False,
    )
    for failure in failures[:REFUSALS_SHOWN]:
        console.print(f"  {printable(failure)}", highlight=False, soft_wrap=True)
    if len(failures) > REFUSALS_SHOWN:  # a forged bundle can break one rule in each of 100,000 members
        console.print(f"  … and {len(failures) - REFUSALS_SHOWN:,} more", highlight=False)
    return 1


def accept_command(args: argparse.Namespace) -> int:
    from kvbench.submissions.accept import accept
    from kvbench.submissions.rebuild import rebuild

    started = time.perf_counter()
    if args.rebuild:
        if args.bundle is not None:
            raise SpecError(f"--rebuild builds {args.db} from the bundles it kept: give no bundle with it")
        rebuilt = rebuild(args.db)
        console.print(
            f"rebuilt {args.db} from {rebuilt.submissions} accepted bundle(s) ({rebuilt.withdrawn} "
            f"withdrawn): {rebuilt.runs} runs in {time.perf_counter() - started:.1f} s; the board reads "
            f"{rebuilt.snapshot}",
            highlight=False,
        )
        return 0
    if args.bundle is None:
        raise SpecError("give the bundle to accept, or --rebuild to build the board again from its bundles")
    with _checked(args.bundle) as opened:
        if opened.checked.failures:
            return _refused(args.bundle, opened.checked.failures)
        done = accept(opened.copy, opened.sha256, opened.checked, args.db, args.by)
    console.print(
        f"accepted {done.sha256[:16]}: {done.runs} runs, {done.samples} samples, pending into {args.db} in "
        f"{time.perf_counter() - started:.1f} s. Nothing of it is scored until it is re-computed here: "
        f"`kvbench verify {done.sha256[:16]} --db {args.db}`",
        highlight=False,
    )
    return 0


def verify_command(args: argparse.Namespace) -> int:
    from kvbench.isolation.host import IsolationLimits
    from kvbench.store.ingest import reading
    from kvbench.submissions.board import find_submission, kept_bundle, recomputed_folder
    from kvbench.submissions.publish import awaiting, record
    from kvbench.submissions.recompute import recompute

    if args.json is not None:
        output_file(args.json, "--json")  # before the re-computation, not after it
    if args.retry and args.db is None:
        raise SpecError("--retry computes again the runs a board recorded as failed: give --db")
    data = {}
    for item in args.data:
        task, eq, path = item.partition("=")
        if not eq or not task:
            raise SpecError(f"--data {item!r}: give TASK=PATH")
        data[task] = Path(path)
    bundle = Path(args.bundle)
    if args.db is not None and not bundle.is_file():
        sha256, withdrawn = find_submission(args.db, args.bundle)
        if withdrawn is not None:
            raise SpecError(f"submission {sha256[:16]} was withdrawn from {args.db}")
        bundle = kept_bundle(args.db, sha256)
    started = time.perf_counter()
    with _checked(bundle) as opened, tempfile.TemporaryDirectory() as scratch:
        if opened.checked.failures:
            return _refused(bundle, opened.checked.failures)
        sha256 = opened.sha256
        only, fresh = None, set()
        if args.db is not None:
            if find_submission(args.db, sha256)[1] is not None:  # given as a file: no computing for nothing
                raise SpecError(f"submission {sha256[:16]} was withdrawn from {args.db}")
            with reading(args.db) as con:
                states = awaiting(con, sha256, args.retry)
            only, fresh = set(states), {identity for identity, state in states.items() if state == "failed"}
        work = args.work or (recomputed_folder(args.db, sha256) if args.db is not None else Path(scratch))
        output_folder(work, "--work")
        if args.plan_only:
            from kvbench.submissions.recompute import planned_cells

            cells = planned_cells(opened.folder, opened.checked, only, args.device, args.attention, data)
            return plan_only(cells, memory_limits(args), args.prompt_tokens or PROMPT_TOKENS)
        runs = [r for r in opened.checked.runs if only is None or r.run_id in only]
        _print_plan(sha256, runs, opened.checked, work, args)
        recomputation = recompute(
            opened.folder,
            opened.checked,
            work,
            only=only,
            fresh=fresh,
            device=args.device,
            attention=args.attention,
            data=data,
            limits=IsolationLimits(
                seconds_per_call=args.scorer_seconds,
                seconds_per_run=args.scorer_run_seconds,
                resident_bytes=int(args.scorer_memory * 2**30),
            ),
            executor=lambda: executor_from(args, work),
            memory=memory_limits(args),
            show_plan=print_plan,
            progress=not args.quiet,
        )
    outcomes = recomputation.outcomes
    published = record(args.db, sha256, outcomes) if args.db is not None else []
    table = Table(
        "run", "cell", "outcome", "claim", "problems", "samples", "detail", title=f"verify {sha256[:16]}"
    )
    for o in outcomes:
        # a label and a detail (a scorer's error) come from the bundle: escaped before the table measures them
        row = (o.run_id, o.label, o.outcome, o.claim, o.problems, o.samples, o.detail)
        table.add_row(*map(printable, row))
    console.print(table)
    machine = json.dumps(outcomes[0].machine) if outcomes else "-"
    console.print(
        f"{recomputation.computed} problem(s) computed, {recomputation.reused} reused from an interrupted "
        f"re-computation; {time.perf_counter() - started:.1f} s on {machine}",
        highlight=False,
    )
    if args.json is not None:
        text = json.dumps({"bundle_sha256": sha256, "outcomes": [asdict(o) for o in outcomes]})
        atomic_write(args.json, lambda temp: temp.write_text(text))
    if args.db is not None:
        console.print(
            f"{len(published)} run(s) published on {args.db} with the numbers computed here", highlight=False
        )
    return _verify_status(outcomes)


def _print_plan(sha256: str, runs: list, checked: Checked, work: Path, args: argparse.Namespace) -> None:
    """What the re-computation will compute, before it starts: its runs, and their problems × samples
    as the bundle holds them (the spec's own problems are computed, whatever the bundle holds)."""
    from kvbench.submissions.presses import shipped_scorer

    assert checked.samples is not None
    held = dict(checked.samples.execute("SELECT run_id, count(*) FROM samples GROUP BY run_id").fetchall())
    units = sum(held.get(r.run_id, 0) for r in runs)
    shipped = sum(1 for r in runs if shipped_scorer(r.spec.policy.name, r.manifest.policy_doc))
    worst = shipped * args.scorer_run_seconds / 3600
    console.print(
        f"re-computing {len(runs)} run(s) of {sha256[:16]} whole: {units} sample(s) as the bundle holds "
        f"them, on {args.device or 'the device each run recorded'} ({args.executor} executor), into "
        f"{work} (an interrupted re-computation resumes from it); a shipped scorer may take "
        f"{args.scorer_seconds:g} s per call and {args.scorer_run_seconds:g} s per run ({shipped} run(s) "
        f"with a shipped scorer: at most {worst:.1f} h of scorer time in all; lower --scorer-run-seconds to "
        f"hold a bundle to less), and its processes {args.scorer_memory:g} GiB resident in all",
        highlight=False,
    )


def _verify_status(outcomes: list) -> int:
    """1 when a run failed, 3 when none failed but one waits for the operator, else 0; each run that
    was not re-computed named on the last lines, for a script that reads only those."""
    failed = [o for o in outcomes if o.outcome == "failed"]
    waiting = [o for o in outcomes if o.outcome == "waiting"]
    for word, found in (("failed", failed), ("waiting", waiting)):
        if found:
            names = ", ".join(f"{o.run_id} ({printable(o.label)})" for o in found)
            console.print(f"{len(found)} run(s) {word}: {names}", highlight=False, soft_wrap=True)
    return 1 if failed else 3 if waiting else 0


def withdraw_command(args: argparse.Namespace) -> int:
    from kvbench.submissions.withdraw import withdraw

    sha256, removed = withdraw(args.db, args.digest, args.reason)
    console.print(f"withdrew {sha256[:16]}: {removed} run(s) removed from {args.db}", highlight=False)
    return 0

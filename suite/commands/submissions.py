"""``kvbench export``, ``accept``, ``verify`` and ``withdraw``: results from many machines onto one board.

A submitter packs runs with `kvbench export`; a leaderboard maintainer checks and records the bundle
with `kvbench accept BUNDLE --db PATH`, re-runs a sample of it with `kvbench verify`, and can take it
back with `kvbench withdraw`. The rules are in kvbench.submissions.rules.
"""

from __future__ import annotations

import argparse
import json
import secrets
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

from kvbench.commands.common import console, output_file, printable
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
        "it, with their withdrawals and verifications); the old file is replaced only once the new one is "
        "complete",
    )
    accept.set_defaults(func=accept_command)

    verify = commands.add_parser(
        "verify",
        help="re-run a seeded sample of a bundle's problems here; exit 1 if a run failed, 3 if one could "
        "not be verified here",
    )
    verify.add_argument("bundle", type=Path)
    verify.add_argument("--sample", type=int, default=2, help="problems per task to re-run (default 2)")
    verify.add_argument(
        "--seed", type=int, help="seed of the draw of problems (default: a random one, printed and recorded)"
    )
    verify.add_argument("--db", type=Path, help="record the outcome in this leaderboard database")
    verify.add_argument("--device", help="re-run on another device (then scores are compared, not outputs)")
    verify.add_argument("--attention", help="re-run with another attention implementation (likewise)")
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


def _refused(bundle: Path, failures: list) -> int:
    console.print(
        Text.assemble(
            (f"{bundle}: refused", "bold red"), f", {len(failures)} rule(s) broken; nothing was written:"
        ),
        highlight=False,
    )
    for failure in failures:
        console.print(f"  {printable(failure)}", highlight=False, soft_wrap=True)
    return 1


def accept_command(args: argparse.Namespace) -> int:
    from kvbench.submissions.board import accept, rebuild

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
        f"accepted {done.sha256[:16]}: {done.runs} runs, {done.samples} samples into {args.db} in "
        f"{time.perf_counter() - started:.1f} s; the board reads {done.snapshot}",
        highlight=False,
    )
    if done.conflicts:
        console.print(
            f"{len(done.conflicts)} run(s) conflict with another submission's: the same spec on the same "
            "output environment gave other outputs. Both stay on the board, flagged; verify both bundles "
            "(`kvbench verify BUNDLE --db ...`) and the one whose re-run differs stops counting:",
            highlight=False,
        )
        for line in done.conflicts:
            console.print(f"  {line}", highlight=False, soft_wrap=True)
    return 0


def verify_command(args: argparse.Namespace) -> int:
    from kvbench.submissions.board import live_submission, record_verification
    from kvbench.submissions.verify import verify

    if args.sample < 1:
        raise SpecError(f"--sample {args.sample}: re-run at least 1 problem per task")
    if args.json is not None:
        output_file(args.json, "--json")  # before the re-runs, not after them
    data = {}
    for item in args.data:
        task, eq, path = item.partition("=")
        if not eq or not task:
            raise SpecError(f"--data {item!r}: give TASK=PATH")
        data[task] = Path(path)
    started = time.perf_counter()
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    with _checked(args.bundle) as opened:
        if opened.checked.failures:
            return _refused(args.bundle, opened.checked.failures)
        sha256 = opened.sha256
        if args.db is not None and not live_submission(args.db, sha256):
            raise SpecError(f"bundle {sha256[:16]} is not a live submission in {args.db}: accept it first")
        outcomes = verify(
            opened.folder,
            opened.checked,
            count=args.sample,
            seed=seed,
            device=args.device,
            attention=args.attention,
            data=data,
            scorer_seconds=args.scorer_seconds,
            scorer_run_seconds=args.scorer_run_seconds,
            progress=not args.quiet,
        )
    title = f"verify {sha256[:16]}, {args.sample} problem(s) per family drawn with seed {seed}"
    table = Table("run", "cell", "outcome", "method", "problems", "detail", title=title)
    for o in outcomes:
        # a label and a detail (a scorer's error) come from the bundle: escaped before the table measures them
        table.add_row(*map(printable, (o.run_id, o.label, o.outcome, o.method, o.problems, o.detail)))
    console.print(table)
    console.print(
        f"{time.perf_counter() - started:.1f} s on {json.dumps(outcomes[0].machine) if outcomes else '-'}",
        highlight=False,
    )
    if args.json is not None:
        text = json.dumps({"bundle_sha256": sha256, "outcomes": [asdict(o) for o in outcomes]})
        atomic_write(args.json, lambda temp: temp.write_text(text))
    if args.db is not None:
        gone = record_verification(args.db, sha256, [{**asdict(o), "seed": seed} for o in outcomes])
        if gone:
            console.print(
                f"{len(gone)} run(s) failed verification and no longer count on {args.db}: no verdict, "
                "pairing or curve reads them (a later verification that passes brings them back)",
                highlight=False,
            )
    return _verify_status(outcomes)


def _verify_status(outcomes: list) -> int:
    """1 when a run failed, 3 when none failed but one could not be verified here, else 0; each run that
    is not verified named on the last lines, for a script that reads only those."""
    failed = [o for o in outcomes if o.outcome == "failed"]
    unchecked = [o for o in outcomes if o.outcome == "not verified"]
    for word, found in (("failed", failed), ("not verified", unchecked)):
        if found:
            names = ", ".join(f"{o.run_id} ({o.label})" for o in found)
            line = f"{len(found)} run(s) {word}: {names}"
            console.print(line, highlight=False, soft_wrap=True)
    return 1 if failed else 3 if unchecked else 0


def withdraw_command(args: argparse.Namespace) -> int:
    from kvbench.submissions.board import withdraw

    sha256, removed = withdraw(args.db, args.digest, args.reason)
    console.print(f"withdrew {sha256[:16]}: {removed} run(s) removed from {args.db}", highlight=False)
    return 0

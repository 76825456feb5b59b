"""The ``kvbench`` command: a thin layer that parses arguments and calls library functions."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.text import Text

from kvbench.commands import (
    analyze,
    bench,
    calibrate,
    check,
    leaderboard,
    lmeval,
    models,
    policies,
    run,
    submissions,
)
from kvbench.commands.common import sleep_when_idle, text_console
from kvbench.errors import KvbenchError
from kvbench.printable import printable

# messages are printed as they are: a path or a name with "[/]" or ":smile:" in it stays that text
errors = text_console(stderr=True, highlight=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvbench",
        description="Benchmark KV-cache eviction scorers against the Random Attention null, same budget.",
        epilog="Start with: kvbench run --policy snapkv --protocol protect-prompt. Docs: README.md, docs/.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for module in (run, check, calibrate, policies, models, bench, leaderboard, submissions, lmeval, analyze):
        module.register(commands)
    return parser


def fail(message: str) -> None:
    """One error line on stderr, ``kvbench:`` in bold red before it. A message may quote a scorer or a
    bundle (a scorer's exception, a name): its control characters are printed escaped."""
    errors.print(Text.assemble(("kvbench:", "bold red"), " ", printable(message, lines=True)), soft_wrap=True)


def main(argv: Sequence[str] | None = None) -> int:
    sleep_when_idle()  # before anything loads torch
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == [lmeval.COMMAND]:  # lm-eval parses its own arguments: argparse would claim its flags
        given = [lmeval.COMMAND, "--", *given[1:]]
    args = build_parser().parse_args(given)
    command = f"`kvbench {args.command}`"
    try:
        return args.func(args)
    except KvbenchError as exc:
        fail(str(exc))
        return 2
    except KeyboardInterrupt as exc:
        where = "".join(f" {note}" for note in getattr(exc, "__notes__", []))  # e.g. in a scorer's call
        fail(
            f"interrupted{where}: {command} stopped before it finished. What it wrote is whole and kept; run "
            "the same command again to go on (`kvbench run` computes only what is missing)."
        )
        return 130
    except MemoryError:
        fail(
            f"out of memory: {command} stopped before it finished. Ask for less at once (fewer problems "
            "or samples with --limit and --samples, a smaller model or budget) or use a machine with more "
            "memory; what was written before is whole and kept."
        )
        return 1
    except SystemExit as exc:
        # kvbench's commands return their exit status: an exit from inside one (a scorer, a plugin, a
        # library) ended its work early, so it never reads as a success
        code = exc.code if isinstance(exc.code, int) and exc.code != 0 else 1
        fail(
            f"{command} did not finish: code it ran raised SystemExit({exc.code!r}) (exit() or sys.exit() "
            "in a scorer, a plugin or a library), so its work is incomplete. Remove that exit and run the "
            "same command again."
        )
        return code


if __name__ == "__main__":
    sys.exit(main())

"""The ``kvbench`` command: a thin layer that parses arguments and calls library functions."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape

from kvbench.commands import analyze, bench, check, leaderboard, lmeval, models, policies, run, submissions
from kvbench.errors import KvbenchError

errors = Console(stderr=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvbench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for module in (run, check, policies, models, bench, leaderboard, submissions, lmeval, analyze):
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == [lmeval.COMMAND]:  # lm-eval parses its own arguments: argparse would claim its flags
        given = [lmeval.COMMAND, "--", *given[1:]]
    args = build_parser().parse_args(given)
    try:
        return args.func(args)
    except KvbenchError as exc:
        errors.print(f"[bold red]kvbench:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())

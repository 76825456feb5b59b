"""Arguments that several subcommands share, so that each maps to one field the same way everywhere."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from kvbench.core.schedule import Schedule

# Piped output is not wrapped at 80 columns: tables stay readable in logs and CI.
console = Console(width=None if sys.stdout.isatty() else 160)


def add_schedule_arguments(parser: argparse.ArgumentParser, budget: int | None = None) -> None:
    group = parser.add_argument_group("eviction schedule")
    group.add_argument(
        "--budget",
        type=int,
        required=budget is None,
        default=budget,
        help="K: cache length after an eviction, buffer included",
    )
    group.add_argument("--buffer", type=int, default=64, help="B: recent tokens never evicted (default 64)")
    group.add_argument("--protection", choices=["prompt", "sinks", "none"], default="prompt")
    group.add_argument(
        "--sinks", type=int, default=4, help="protected leading tokens with --protection sinks"
    )
    group.add_argument("--order", choices=["chronological", "score"], default="chronological")


def schedule_from(args: argparse.Namespace) -> Schedule:
    return Schedule(
        budget=args.budget, buffer=args.buffer, protection=args.protection, sinks=args.sinks, order=args.order
    )


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"

"""The ``kvbench`` command: a thin layer that parses arguments and calls library functions."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvbench.errors import KvbenchError

console = Console()
errors = Console(stderr=True)


def _list(args: argparse.Namespace) -> int:
    from kvbench.registry import known_policies

    if args.what == "policies":
        for name, cls in known_policies().items():
            needs = f"  [needs: {', '.join(sorted(cls.needs))}]" if cls.needs else ""
            print(f"{name}\t{cls.description}{needs}")
    return 0


def _new_policy(args: argparse.Namespace) -> int:
    import kvbench.policies
    from kvbench.errors import SpecError
    from kvbench.registry import known_policies
    from kvbench.scaffold import class_name, write_template

    if args.name in known_policies():
        raise SpecError(f"a policy named {args.name!r} exists already; choose another name")
    folder = Path(args.dir) if args.dir else Path(kvbench.policies.__path__[0])
    path = write_template(args.name, folder)
    in_package = folder.resolve() == Path(kvbench.policies.__path__[0]).resolve()
    use = args.name if in_package else f"{path}:{class_name(args.name)}"
    print(f"wrote {path}\nedit its score(); select it with --policy {use}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    import torch

    from kvbench.bench.evict import as_rows, bench_evict
    from kvbench.bench.machine import describe_machine

    dtype = args.dtype
    results = bench_evict(
        args.policy or None,
        batches=args.batch,
        budget=args.budget,
        buffer=args.buffer,
        dtype=getattr(torch, dtype),
        min_run_time=args.min_time,
    )
    machine = describe_machine()
    table = Table(
        title=f"one eviction event per layer: Hkv=8 Hq=32 D=128 K={args.budget} B={args.buffer} {dtype}"
    )
    for column in ("policy", "batch", "ms / event", "× random", "runs"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for r in results:
        table.add_row(
            r.policy, str(r.batch), f"{r.ms_per_event:.2f}", f"{r.ratio_to_random:.2f}", str(r.runs)
        )
    console.print(table)
    console.print(
        f"machine: {machine['cpu']}, {machine['cpu_count']} CPUs, torch {machine['torch']} "
        f"({machine['torch_threads']} threads)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "results": as_rows(results)}, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvbench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    listing = commands.add_parser("list", help="list registered policies")
    listing.add_argument("what", choices=["policies"])
    listing.set_defaults(func=_list)

    new = commands.add_parser("new-policy", help="write a commented, working scorer template")
    new.add_argument("name")
    new.add_argument("--dir", help="folder to write into (default: the policies/ folder of kvbench)")
    new.set_defaults(func=_new_policy)

    bench = commands.add_parser("bench", help="benchmarks, side by side in one process")
    bench_kinds = bench.add_subparsers(dest="kind", required=True)
    evict = bench_kinds.add_parser("evict", help="ms per eviction event per policy at paper shapes")
    evict.add_argument("--policy", action="append", help="policy to time (repeatable; default: all)")
    evict.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    evict.add_argument("--budget", type=int, default=2048)
    evict.add_argument("--buffer", type=int, default=64)
    evict.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    evict.add_argument("--min-time", type=float, default=1.0, help="seconds of timing per policy and batch")
    evict.add_argument("--json", help="also write the results and the machine to this file")
    evict.set_defaults(func=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KvbenchError as exc:
        errors.print(f"[bold red]kvbench:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``kvbench list`` and ``kvbench new-policy``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvbench.printable import printable


def register(commands: argparse._SubParsersAction) -> None:
    listing = commands.add_parser("list", help="list policies, tasks, protocols, suites or models")
    listing.add_argument("what", choices=["policies", "tasks", "protocols", "suites", "models"])
    listing.set_defaults(func=list_things)

    new = commands.add_parser("new-policy", help="write a commented, working scorer template")
    new.add_argument("name")
    new.add_argument(
        "--dir",
        default=".",
        help="folder to write into (default: the current one; kvbench's policies/ makes a built-in)",
    )
    new.set_defaults(func=new_policy)


def list_things(args: argparse.Namespace) -> int:
    if args.what == "policies":
        from kvbench.registry import known_policies

        for name, cls in known_policies().items():
            needs = f"  [needs: {', '.join(sorted(cls.needs))}]" if cls.needs else ""
            # an installed package's policy documents itself: its text is printed escaped
            print(f"{printable(name)}\t{printable(cls.description)}{printable(needs)}")
        from kvbench.kvpress.listing import kvpress_lines

        for name, what in kvpress_lines():  # kvpress's presses, from the kvpress venv: escaped as well
            print(f"{printable(name)}\t{printable(what)}")
    elif args.what == "models":
        from kvbench.specs.model import load_model_spec, model_names

        for name in model_names():
            spec = load_model_spec(name)
            print(f"{name}\t{spec.family}\t{spec.source.kind}\t{spec.description.split('.')[0]}")
    else:
        from kvbench.specs.protocol import load_protocol, protocol_names
        from kvbench.specs.suite import load_suite, suite_names
        from kvbench.specs.task import load_task, task_names

        loaders: dict[str, tuple[Callable[[], list[str]], Callable[[str], Any]]] = {
            "tasks": (task_names, load_task),
            "protocols": (protocol_names, load_protocol),
            "suites": (suite_names, load_suite),
        }
        names, load = loaders[args.what]
        for name in names():
            print(f"{name}\t{' '.join(load(name).description.split())}")
    return 0


def new_policy(args: argparse.Namespace) -> int:
    import kvbench.policies
    from kvbench.errors import SpecError
    from kvbench.registry import known_policies
    from kvbench.scaffold import write_template

    if args.name in known_policies():
        raise SpecError(f"a policy named {args.name!r} exists already; choose another name")
    package_dir = Path(kvbench.policies.__path__[0])
    folder = Path(args.dir)
    path, use = write_template(args.name, folder, builtin=folder.resolve() == package_dir.resolve())
    print(f"wrote {path}\nedit its score(); select it with --policy {use}")
    return 0

"""``kvbench lm-eval ARGS...``: lm-eval's own command line, with ``--model kvbench`` registered first."""

from __future__ import annotations

import argparse
import sys

COMMAND = "lm-eval"


def register(commands: argparse._SubParsersAction) -> None:
    lm_eval = commands.add_parser(
        COMMAND,
        help="run lm-eval's command line with the kvbench model registered (--model kvbench)",
        description=(
            "Every argument goes to lm-eval's own command line unchanged, e.g. kvbench lm-eval --model "
            "kvbench --model_args model=tiny-qwen3,policy=snapkv,budget=128 --tasks NAME --limit 4"
        ),
        add_help=False,
    )
    lm_eval.add_argument("lm_eval_args", nargs=argparse.REMAINDER)
    lm_eval.set_defaults(func=lm_eval_command)


def lm_eval_command(args: argparse.Namespace) -> int:
    from lm_eval.__main__ import cli_evaluate

    from kvbench.lmeval.model import register

    register()
    # lm-eval's entry point reads sys.argv and takes no argument: it sees the command line it would see
    # as `lm-eval ARGS...`, and sys.argv is restored afterwards.
    forwarded = args.lm_eval_args[1:] if args.lm_eval_args[:1] == ["--"] else args.lm_eval_args
    saved, sys.argv = sys.argv, ["lm-eval", *forwarded]
    try:
        cli_evaluate()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return 0

"""``kvbench run``'s memory flags: the plan printed before the first token, and ``--plan-only``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.filesize import decimal

from kvbench.commands.common import console, measured_table

if TYPE_CHECKING:
    from kvbench.runner.cell import Cell
    from kvbench.runner.memory import MemoryLimits, MemoryPlan

PROMPT_TOKENS = 512
"""The prompt length ``--plan-only`` assumes without ``--prompt-tokens`` (a run measures its own)."""


def add_memory_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("memory (a problem's samples in micro-batches that fit the device)")
    group.add_argument(
        "--max-batch",
        type=int,
        help="at most this many samples of a problem decode at once (default: as many as the memory holds)",
    )
    group.add_argument(
        "--gpu-memory",
        "--device-memory",
        dest="device_memory",
        metavar="SIZE",
        help="memory the plan may fill, e.g. 80GB (10^9 bytes) or 75GiB (2^30) (default: on CUDA the "
        "device's free memory before the model loads; on CPU no limit)",
    )
    group.add_argument(
        "--plan-only",
        action="store_true",
        help="print the memory plan from the models' configs and stop (no weights loaded, nothing run)",
    )
    group.add_argument(
        "--prompt-tokens",
        type=int,
        help=f"with --plan-only: the prompt length to plan for (default: {PROMPT_TOKENS}; a run plans "
        "with each task's longest prompt)",
    )


def memory_limits(args: argparse.Namespace) -> MemoryLimits:
    """The flags as the planner's limits, refused with the flag's name when malformed."""
    from kvbench.errors import SpecError
    from kvbench.runner.memory import MemoryLimits

    if args.max_batch is not None and args.max_batch < 1:
        raise SpecError(f"--max-batch {args.max_batch}: give at least 1 sample")
    if args.prompt_tokens is not None and not args.plan_only:
        raise SpecError("--prompt-tokens is for --plan-only: a run plans with each task's longest prompt")
    if args.prompt_tokens is not None and args.prompt_tokens < 1:
        raise SpecError(f"--prompt-tokens {args.prompt_tokens}: give at least 1 token")
    size = None if args.device_memory is None else _size(args.device_memory)
    source = "" if size is None else f"--gpu-memory {args.device_memory}"
    return MemoryLimits(max_batch=args.max_batch, device_memory=size, source=source)


def _size(text: str) -> int:
    """``--gpu-memory`` in bytes: 80GB (10^9), 75GiB (2^30), or plain bytes (pydantic's ByteSize)."""
    import pydantic

    from kvbench.errors import SpecError

    try:
        size = int(pydantic.TypeAdapter(pydantic.ByteSize).validate_python(text))
    except pydantic.ValidationError:
        size = 0
    if size <= 0:
        raise SpecError(f"--gpu-memory {text!r}: give a size such as 80GB (10^9 bytes) or 75GiB (2^30 bytes)")
    return size


def plan_only(cells: Sequence[Cell], limits: MemoryLimits, prompt_tokens: int) -> int:
    """Print each model's plan from its config alone (``--plan-only``); refuse an arm that cannot fit."""
    from kvbench.adapters.base import find_adapter
    from kvbench.errors import SpecError
    from kvbench.runner.memory import DeviceFacts, free_memory, plan_memory
    from kvbench.runner.sources import task_source

    for model, runtime in dict.fromkeys((c.model, c.runtime) for c in cells):
        group = [c for c in cells if (c.model, c.runtime) == (model, runtime)]
        adapter = find_adapter(runtime.adapter)
        read_shape = getattr(adapter, "shape", None)
        if read_shape is None:
            console.print(f"{model.name}: the {adapter.name} adapter plans its own memory; no plan here")
            continue
        free = free_memory(runtime.device)
        if runtime.device_kind == "cuda" and free is None and limits.device_memory is None:
            raise SpecError(
                f"--plan-only --device {runtime.device}: torch sees no CUDA device here to read its free "
                "memory from; give the device's memory with --gpu-memory (e.g. 80GB)"
            )
        generating = [c for c in group if not task_source(c.task).teacher_forced]
        facts = DeviceFacts(
            shape=read_shape(model),
            device=runtime.device,
            free=free,
            prompt_tokens=dict.fromkeys((c.run_id for c in generating), prompt_tokens),
        )
        plan = plan_memory(group, facts, limits)
        if plan is not None:
            print_plan(plan)
        skipped = sorted({c.task.name for c in group} - {c.task.name for c in generating})
        if skipped:
            console.print(f"not planned (teacher-forced probes, every row in one pass): {', '.join(skipped)}")
    return 0


def print_plan(plan: MemoryPlan) -> None:
    """The plan as a table: per arm its cache, micro-batch and total against the device."""
    from kvbench.runner.memory import RESERVE, slot_bytes

    shape = plan.shape
    device = "no memory limit" if plan.device is None else f"{decimal(plan.device)}: {plan.device_source}"
    console.print(f"memory plan: {shape.name} in {shape.dtype} ({device})")
    console.print(
        f"  weights {decimal(shape.weight_bytes)} ({shape.parameters:,} parameters × {shape.dtype_bytes} "
        f"bytes), reserve {decimal(RESERVE)} (allocator and kernel workspaces)"
    )
    console.print(
        f"  KV {shape.kv_bytes_per_token:,} bytes per token ({shape.layers} layers × {shape.kv_heads} KV "
        f"heads × {shape.head_dim} dims × key and value × {shape.dtype_bytes} bytes); "
        f"{slot_bytes(shape) * shape.layers:,} per cached slot with its positions"
    )
    if plan.max_batch is not None:
        console.print(f"  at most {plan.max_batch} samples at once (--max-batch)")
    columns = ("arm", "tokens", "K", "slots", "cache/sample", "batch", "batches", "activations", "total")
    table = measured_table(None, columns)
    for arm in plan.arms:
        table.add_row(
            arm.label,
            f"{arm.prompt_tokens:,}+{arm.max_new_tokens:,}",
            "-" if arm.budget is None else f"{arm.budget:,}",
            f"{arm.slots:,}",
            decimal(arm.cache_bytes),
            f"{arm.batch} of {arm.samples}",
            str(arm.batches),
            decimal(arm.activations),
            decimal(arm.total),
        )
    console.print(table)
    for arm in plan.arms:
        if arm.note:
            console.print(f"  {arm.label}: {arm.note}")

"""``kvbench bench evict`` and ``kvbench bench decode``: measured side by side, reported as ratios."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from rich.table import Table

from kvbench.commands.common import console, measured_table, mib, output_file, output_folder


def register(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="benchmarks, side by side in one process")
    kinds = bench.add_subparsers(dest="kind", required=True)

    evict = kinds.add_parser("evict", help="ms per eviction event per policy at paper shapes")
    evict.add_argument("--policy", action="append", help="policy to time (repeatable; default: all)")
    evict.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    evict.add_argument("--budget", type=int, default=2048)
    evict.add_argument("--buffer", type=int, default=64)
    evict.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    evict.add_argument("--layers", type=int, default=1, help="layers evicted per event (a whole model's)")
    evict.add_argument("--device", default="cpu", help="cpu, or cuda (timed with CUDA events)")
    evict.add_argument("--min-time", type=float, default=1.0, help="seconds of timing per policy and batch")
    evict.add_argument(
        "--isolated",
        action="append",
        default=[],
        metavar="FILE.py:Class",
        help="also time this scorer file in its own process behind the sandbox, beside in this process",
    )
    evict.add_argument(
        "--telemetry-cost",
        action="store_true",
        help="also time every policy with the retention telemetry off, and report the ratio (on / off)",
    )
    evict.add_argument(
        "--keys",
        choices=["random", "real"],
        action="append",
        help="time on random draws (the worst case of R-KV's search) or on keys the embedded model made on "
        "a real trace (captured on first use, about a minute); repeatable (default: both)",
    )
    evict.add_argument("--json", help="also write the results and the machine to this file")
    evict.set_defaults(func=bench_evict_command)

    decode = kinds.add_parser("decode", help="decode tokens/s and KV memory per policy in a real model")
    decode.epilog = (
        "`make gpu-check` runs it on a GPU at a fixed batch and at iso-memory (runs/gpu-check/README.md)"
    )
    decode.add_argument("--model", default="smollm2-135m")
    decode.add_argument("--policy", action="append", help="policy to run besides full (repeatable)")
    decode.add_argument("--tokens", type=int, default=4096, help="generated tokens per policy (EOS ignored)")
    decode.add_argument("--budget", type=int, default=512)
    decode.add_argument("--buffer", type=int, default=64)
    decode.add_argument(
        "--batch", type=int, default=1, help="rows decoded at once, the same for every policy"
    )
    decode.add_argument("--prompt-tokens", type=int, help="cut or repeat the prompt to this many tokens")
    decode.add_argument("--device", default="cpu", help="cpu or cuda")
    decode.add_argument(
        "--precision",
        action="append",
        default=None,
        metavar="PROTOCOL",
        help="also run full and random in this protocol's mixed-precision cache (repeatable; "
        "default: mixed-4bit and uniform-4bit; 'none' for none)",
    )
    decode.add_argument("--json", help="also write the results and the machine to this file")
    decode.add_argument(
        "--out",
        type=Path,
        help="also record the results in this results folder's database (runs/), for the leaderboard",
    )
    decode.set_defaults(func=bench_decode_command)

    serve = kinds.add_parser(
        "serve", help="vLLM: output tok/s, concurrency and TPOT of the full cache and each policy at K"
    )
    serve.add_argument("--model", default="tiny-qwen3-d64")
    serve.add_argument("--policy", action="append", help="policy to run besides full (repeatable)")
    serve.add_argument("--budget", type=int, default=96)
    serve.add_argument("--buffer", type=int, default=8)
    serve.add_argument("--requests", type=int, default=32, help="requests submitted at once (memory-bound)")
    serve.add_argument("--output-len", type=int, default=512, help="tokens per request (EOS ignored)")
    serve.add_argument(
        "--pool-blocks", type=int, default=64, help="the fixed KV pool, in blocks of 32 tokens"
    )
    serve.add_argument("--json", help="also write the results and the machine to this file")
    serve.add_argument("--out", type=Path, help="also record the results in this results folder's database")
    serve.set_defaults(func=bench_serve_command)

    board = kinds.add_parser("leaderboard", help="seconds to render the leaderboard as the database grows")
    board.set_defaults(func=bench_leaderboard_command)

    sandbox = kinds.add_parser("sandbox", help="ms per code test inside the sandbox against a plain process")
    sandbox.add_argument("--repeats", type=int, default=50)
    sandbox.set_defaults(func=bench_sandbox_command)


def bench_sandbox_command(args: argparse.Namespace) -> int:
    from kvbench.bench.sandbox import time_sandbox
    from kvbench.provenance import describe_machine

    rows = time_sandbox(args.repeats)
    title = "one code test: a plain subprocess against the sandbox (bwrap + harness + grading)"
    table = measured_table(title, ("arm", "runs", "median ms", "p90 ms", "× plain"))
    for row in rows:
        ratio = row.median_ms / rows[0].median_ms
        table.add_row(row.arm, str(row.runs), f"{row.median_ms:.1f}", f"{row.p90_ms:.1f}", f"{ratio:.2f}")
    _report(table, describe_machine())
    return 0


def _report(table: Table, machine: dict, rows: Sequence = (), json_path: str | None = None) -> None:
    """The table and the machine it was measured on; with --json, the machine and the rows written there."""
    from kvbench.store.atomic import atomic_write

    console.print(table)
    console.print(
        f"machine: {machine['cpu']}, {machine['cpu_count']} CPUs, torch {machine['torch']} "
        f"({machine['torch_threads']} threads)"
    )
    if json_path:
        text = json.dumps({"machine": machine, "results": [asdict(r) for r in rows]}, indent=2)
        atomic_write(Path(json_path), lambda temp: temp.write_text(text))


def _outputs(args: argparse.Namespace) -> None:
    """--json's folder and --out, made and checked writable before the benchmark, not after it."""
    if args.json:
        output_file(Path(args.json), "--json")
    if getattr(args, "out", None):
        output_folder(args.out, "--out")


def bench_evict_command(args: argparse.Namespace) -> int:
    import torch

    from kvbench.bench.evict import HEAD_DIM, KV_HEADS, Q_HEADS, bench_evict, beyond_goal
    from kvbench.core.hardware import eviction_choices
    from kvbench.provenance import describe_machine

    _outputs(args)
    choices = eviction_choices(args.device)
    console.print(
        f"R-KV's near-duplicate screen multiplies in {choices['near_duplicate_screen']}: "
        f"{choices['near_duplicate_screen_why']}; in strips of {choices['near_duplicate_strip']} columns: "
        f"{choices['near_duplicate_strip_why']}",
        highlight=False,
    )
    results = bench_evict(
        args.policy or None,
        batches=args.batch,
        budget=args.budget,
        buffer=args.buffer,
        dtype=getattr(torch, args.dtype),
        min_run_time=args.min_time,
        isolated=args.isolated,
        layers=args.layers,
        device=args.device,
        telemetry_cost=args.telemetry_cost,
        keys=args.keys or ("random", "real"),
        said=lambda line: console.print(line, highlight=False),
    )
    timed_on = "one torch thread" if args.device == "cpu" else "CUDA events"
    kinds = list(dict.fromkeys(r.keys for r in results))
    columns = ["policy", "batch"]
    for kind in kinds:
        columns += [f"{kind} keys ms", "× random"]
    columns += ["copy floor ms", f"× floor ({kinds[0]} keys)" if kinds else "× floor", "runs"]
    columns += ["isolated / in process"] if args.isolated else []
    columns += ["telemetry on / off"] if args.telemetry_cost else []
    title = (
        f"one eviction event of {args.layers} layer(s): Hkv={KV_HEADS} Hq={Q_HEADS} D={HEAD_DIM} "
        f"K={args.budget} B={args.buffer} {args.dtype} on {args.device} (timed on {timed_on})"
    )
    table = measured_table(title, columns)
    by = {(r.keys, r.policy, r.batch): r for r in results}
    for policy, batch in dict.fromkeys((r.policy, r.batch) for r in results):
        row = [by.get((kind, policy, batch)) for kind in kinds]
        first = next(r for r in row if r is not None)
        times = [
            cell
            for r in row
            for cell in ((f"{r.ms_per_event:.2f}", f"{r.ratio_to_random:.2f}") if r else ("", ""))
        ]
        apart = by.get((first.keys, policy.removesuffix(" (isolated)") + " (in process)", batch))
        isolation = (
            f"{first.ms_per_event / apart.ms_per_event:.2f}"
            if policy.endswith(" (isolated)") and apart
            else ""
        )
        table.add_row(
            policy,
            str(batch),
            *times,
            f"{first.copy_floor_ms:.3f}",
            f"{first.ms_per_event / first.copy_floor_ms:.2f}" if first.copy_floor_ms else "",
            "/".join(str(r.runs) for r in row if r),
            *([isolation] if args.isolated else []),
            *(
                [f"{first.telemetry_ratio:.3f}" if first.telemetry_ratio is not None else ""]
                if args.telemetry_cost
                else []
            ),
        )
    _report(table, describe_machine(args.device), results, args.json)
    for line in beyond_goal(results, budget=args.budget, layers=args.layers):
        console.print(line, highlight=False)
    return 0


def _record(out: Path, settings: dict, machine: dict, rows: list, kind: str = "decode") -> Path:
    """One JSON file per benchmark under OUT/bench/, then ingested into OUT's database."""
    import time
    import uuid

    from kvbench.store.atomic import atomic_write
    from kvbench.store.ingest import ingest

    folder = out / "bench"
    created = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(created))
    # the random part: two benchmarks finishing in the same second (two GPUs) keep both records
    path = folder / f"{kind}-{settings['model']}-{stamp}-{uuid.uuid4().hex[:8]}.json"
    record = {
        "created": created,
        "settings": settings,
        "machine": machine,
        "results": [asdict(r) for r in rows],
    }
    atomic_write(path, lambda temp: temp.write_text(json.dumps(record, indent=2)))
    ingest(out)
    return path


def bench_decode_command(args: argparse.Namespace) -> int:
    from kvbench.bench.decode import bench_decode
    from kvbench.provenance import describe_machine

    _outputs(args)
    policies = args.policy or ["random", "streaming", "snapkv", "h2o", "vase-attnv"]
    precisions = [p for p in args.precision or ["mixed-4bit", "uniform-4bit"] if p != "none"]
    results = bench_decode(
        args.model,
        policies,
        tokens=args.tokens,
        budget=args.budget,
        buffer=args.buffer,
        precisions=precisions,
        batch=args.batch,
        prompt_tokens=args.prompt_tokens,
        device=args.device,
    )
    title = (
        f"{args.model} on {args.device}: {args.tokens} generated tokens per row, batch {args.batch} "
        f"for every policy (fixed-batch, not memory-bound), K={args.budget}, B={args.buffer}"
    )
    columns = ("policy", "K held", "tokens/s", "× full", "events", "ms / event", "barrier stall ms",
               "time evicting", "peak KV", "KV × full", "freed / seq")  # fmt: skip
    table = measured_table(title, columns)
    for r in results:
        table.add_row(
            r.policy,
            str(r.kv_budget_tokens or "-"),
            f"{r.tokens_per_second:.1f}",
            f"{r.speed_vs_full:.2f}",
            str(r.eviction_events),
            f"{r.ms_per_event:.1f}",
            f"{r.barrier_stall_ms:.1f}",
            f"{r.eviction_share:.1%}",
            mib(r.peak_kv_bytes),
            f"{r.memory_vs_full:.2f}",
            mib(r.kv_bytes_freed_per_sequence),
        )
    machine = describe_machine(args.device)
    _report(table, machine, results, args.json)
    if args.out:
        settings = {k: getattr(args, k) for k in ("model", "tokens", "budget", "buffer", "batch", "device")}
        settings["batching"] = "fixed-batch"
        console.print(f"recorded in {_record(args.out, settings, machine, results)}")
    return 0


def bench_serve_command(args: argparse.Namespace) -> int:
    from kvbench.bench.serve import bench_serve
    from kvbench.provenance import describe_machine

    _outputs(args)
    policies = args.policy or ["random", "streaming", "snapkv"]
    results = bench_serve(
        args.model,
        policies,
        budget=args.budget,
        buffer=args.buffer,
        requests=args.requests,
        output_len=args.output_len,
        pool_blocks=args.pool_blocks,
    )
    title = (
        f"{args.model} on vLLM: {args.requests} requests × {args.output_len} tokens into "
        f"{args.pool_blocks} blocks (iso-memory: the same pool for every arm), "
        f"K={args.budget}, B={args.buffer}"
    )
    columns = ("policy", "memory", "out tok/s", "× full", "req/s", "peak running", "× full",
               "peak blocks", "preempt", "TPOT ms", "× full", "events", "select ms/ev", "move ms/ev",
               "time evicting")  # fmt: skip
    table = measured_table(title, columns)
    for r in results:
        table.add_row(
            r.policy,
            "memory-bound" if r.memory_bound else "not memory-bound",
            f"{r.output_tokens_per_second:.1f}",
            f"{r.speed_vs_full:.2f}",
            f"{r.requests_per_second:.3f}",
            str(r.peak_running),
            f"{r.concurrency_vs_full:.2f}",
            f"{r.peak_blocks}/{r.pool_blocks}",
            str(r.preemptions),
            f"{r.tpot_ms:.2f}",
            f"{r.tpot_vs_full:.2f}",
            str(r.eviction_events),
            f"{r.select_ms_per_event:.2f}",
            f"{r.move_ms_per_event:.2f}",
            f"{r.eviction_share:.1%}",
        )
    machine = {**describe_machine(), "adapter": "vllm"}
    _report(table, machine, results, args.json)
    if args.out:
        settings = {
            "model": args.model, "adapter": "vllm", "budget": args.budget, "buffer": args.buffer,
            "requests": args.requests, "tokens": args.output_len, "pool_blocks": args.pool_blocks,
        }  # fmt: skip
        console.print(f"recorded in {_record(args.out, settings, machine, results, kind='serve')}")
    return 0


def bench_leaderboard_command(args: argparse.Namespace) -> int:
    import tempfile

    from kvbench.bench.leaderboard import CASES, synthetic_store, time_render
    from kvbench.provenance import describe_machine

    title = "leaderboard: one app run (queries, statistics, layout) on synthetic stores, 4 tasks"
    table = measured_table(title, ("store", "policies", "sample rows", "first render (s)", "rerun (s)"))
    with tempfile.TemporaryDirectory(prefix="kvbench-board-") as scratch:
        for label, shape, public in CASES:
            database = Path(scratch) / f"{label.replace(' ', '-').replace(',', '')}.duckdb"
            rows = synthetic_store(database, **shape)
            timing = time_render(database, label, shape["policies"], rows, public)
            table.add_row(
                label,
                str(timing.policies),
                f"{timing.rows:,}",
                f"{timing.first_render_seconds:.2f}",
                f"{timing.cached_render_seconds:.2f}",
            )
    _report(table, describe_machine())
    return 0

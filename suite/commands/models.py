"""``kvbench generate`` and ``kvbench calibrate``: a policy acting inside a real model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from kvbench.commands.common import add_threads_argument, console, mib, use_threads, warn_if_busy

if TYPE_CHECKING:
    from kvbench.core.contract import Policy


def register(commands: argparse._SubParsersAction) -> None:
    gen = commands.add_parser(
        "generate", help="complete a prompt under an eviction policy; print its statistics"
    )
    gen.add_argument("prompt")
    gen.add_argument("--model", default="smollm2-135m")
    gen.add_argument("--policy", default="random", help="NAME[:k=v,...] or path/file.py:Class[:k=v,...]")
    schedule = gen.add_argument_group("eviction schedule")
    schedule.add_argument(
        "--budget", type=int, required=True, help="K: cache length after an eviction, buffer included"
    )
    schedule.add_argument(
        "--buffer", type=int, default=64, help="B: recent tokens never evicted (default 64)"
    )
    schedule.add_argument("--protection", choices=["prompt", "sinks", "none"], default="prompt")
    schedule.add_argument(
        "--sinks", type=int, default=4, help="protected leading tokens with --protection sinks"
    )
    schedule.add_argument("--order", choices=["chronological", "score"], default="chronological")
    gen.add_argument("--samples", type=int, default=1, help="samples of the prompt, decoded as one batch")
    gen.add_argument("--max-new-tokens", type=int, default=256)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--calibration", type=Path, help="statistics file for policies that need calibration")
    gen.add_argument(
        "--adapter", default="hf", help="backend, by name (hf: transformers; vllm: a vLLM engine)"
    )
    gen.add_argument("--device", default="cpu")
    add_threads_argument(gen)
    gen.set_defaults(func=generate_command)

    cal = commands.add_parser("calibrate", help="query statistics for triattention, keyed by model")
    cal.add_argument("--model", default="smollm2-135m")
    cal.add_argument(
        "--corpus", type=Path, help="calibration text (default: kvbench's own prose, no test set)"
    )
    cal.add_argument("--max-tokens", type=int, default=4096)
    cal.add_argument("--out", type=Path, help="default: runs/calibration/MODEL.safetensors")
    cal.set_defaults(func=calibrate_command)


def generate_command(args: argparse.Namespace) -> int:
    from kvbench.adapters.base import Sampling, ended, find_adapter
    from kvbench.commands.common import measured_table
    from kvbench.core.calibration import QueryStats, default_path
    from kvbench.core.schedule import Schedule
    from kvbench.core.seeding import sample_seed
    from kvbench.registry import make_policy
    from kvbench.specs.model import load_model_spec

    use_threads(args.threads)
    policy: Policy
    from kvbench.kvpress.catalog import press_of

    if press_of(args.policy) is not None:  # a kvpress press, scored in kvpress's own environment
        from kvbench.kvpress.policy import kvpress_policy

        policy = kvpress_policy(args.policy)
    else:
        policy = make_policy(args.policy)
    schedule = Schedule(
        budget=args.budget, buffer=args.buffer, protection=args.protection, sinks=args.sinks, order=args.order
    )
    spec = load_model_spec(args.model)
    warn_if_busy(args.threads, args.device)
    with ended(find_adapter(args.adapter).load(spec, device=args.device, attention="sdpa")) as backend:
        calibration = None  # the statistics a policy needs, None when it needs none
        if "calibration" in policy.needs:
            calibration = QueryStats.load(args.calibration or default_path(spec.name), model=spec.name)
        seeds = [sample_seed(args.seed, "generate", args.prompt, i) for i in range(args.samples)]
        result = backend.generate(
            backend.prompt_ids(args.prompt),
            policy,
            schedule,
            sample_seeds=seeds,
            sampling=Sampling(args.temperature, args.top_p, args.top_k),
            max_new_tokens=args.max_new_tokens,
            ignore_stop=args.ignore_eos,
            calibration=calibration,
            refuse_capped_prompt=True,
        )
    for i, sample in enumerate(result.samples):
        console.rule(f"sample {i} ({sample.finish_reason}, {sample.generated} tokens)")
        console.print(sample.text, highlight=False)  # the console reads no markup
    title = f"{policy.name} on {spec.name}: K={schedule.budget}, B={schedule.buffer}, "
    title += f"protection={schedule.protection}"
    table = measured_table(title, ("quantity", "value"))
    per_event = result.eviction_seconds / result.eviction_events * 1e3 if result.eviction_events else 0.0
    decoding = max(result.decode_seconds, 1e-9)
    table.add_row("adapter", args.adapter)
    table.add_row("prompt tokens (protected)", f"{result.prompt_tokens} ({result.protected.count})")
    table.add_row("generated tokens", ", ".join(str(s.generated) for s in result.samples))
    table.add_row("eviction events", str(result.eviction_events))
    table.add_row("ms per event", f"{per_event:.2f}")
    table.add_row("share of decode time evicting", f"{result.eviction_seconds / decoding:.1%}")
    table.add_row("decode tokens/s", f"{sum(s.generated for s in result.samples) / decoding:.1f}")
    table.add_row("peak KV cache", mib(result.peak_kv_bytes))
    console.print(table)
    return 0


def calibrate_command(args: argparse.Namespace) -> int:
    from kvbench.adapters.hf.calibrate import calibrate
    from kvbench.adapters.hf.models import load_model
    from kvbench.core.calibration import default_path

    loaded = load_model(args.model)
    stats = calibrate(loaded, args.corpus, max_tokens=args.max_tokens)
    out = args.out or default_path(loaded.spec.name)
    stats.save(out)
    console.print(f"wrote {out}: {stats.tokens} tokens of {stats.corpus}, {stats.mean.shape[0]} layers")
    return 0

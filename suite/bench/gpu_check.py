"""``make gpu-check``: one offline check of kvbench on a GPU, written as one JSON report and a summary.

Sections (runs/gpu-check/README.md documents every field):
- parity: every evicting policy's kept positions at every event, on the device against the CPU;
- event_cost: ms per eviction event of every built-in policy at the Random Attention paper's Table 9 shape
  (kvbench.bench.evict), beside the copy floor and the paper's H200 figures;
- decode: full against random at K, HF backend, batched (kvbench.bench.decode), at a fixed batch and at
  the largest batch each arm's memory admits (iso-memory);
- flash_attention: the decode rows again through flash-attention 2, when ``flash_attn`` imports.

``--device cpu`` runs every section at tiny shapes (CI runs it, so the script cannot rot). The script
imports only what the locked-down GPU node has (requirements/gpu-node.txt) plus the few wheels
``make gpu-wheels`` carries (requirements/gpu-wheels.txt); the report lists any other import it made.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import json
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

SCHEMA_VERSION = 1

PAPER_H200_MS = {"random": 0.30, "snapkv": 0.37, "rkv": 0.58, "vase-attnv": 0.74, "triattention": 1.47}
"""Random Attention paper, Table 9 (Qwen3-4B-like shape, one H200): ms per eviction event. "VASE" is
read as vase-attnv, "R-KV" as rkv (the papers' variant)."""


@dataclass(frozen=True)
class Shapes:
    """Everything a scale fixes; ``cpu`` is for CI, ``gpu`` for an H100/H200 in under 8 minutes."""

    parity_budget: int
    parity_buffer: int
    parity_prompt: int
    parity_tokens: int
    evict_layers: int
    evict_kv_heads: int
    evict_q_heads: int
    evict_head_dim: int
    evict_budget: int
    evict_buffer: int
    evict_batches: tuple[int, ...]
    evict_min_time: float
    bandwidth_bytes: int
    decode_model: str
    decode_prompt: int
    decode_tokens: int
    decode_budget: int
    decode_buffer: int
    decode_fixed_batch: int
    decode_memory_share: float
    """Share of the device's free memory (after the weights) the iso-memory arms may fill with KV."""
    decode_memory_cap: int | None = None
    """Bytes standing in for the device's memory (the CPU's is not the limit a GPU's is)."""


SCALES = {
    "cpu": Shapes(
        parity_budget=32, parity_buffer=8, parity_prompt=16, parity_tokens=112,
        evict_layers=2, evict_kv_heads=2, evict_q_heads=4, evict_head_dim=16, evict_budget=64,
        evict_buffer=16, evict_batches=(1, 4), evict_min_time=0.02, bandwidth_bytes=1 << 22,
        decode_model="tiny-qwen3", decode_prompt=32, decode_tokens=112, decode_budget=32,
        decode_buffer=8, decode_fixed_batch=4, decode_memory_share=1.0,
        decode_memory_cap=8 * (32 + 112) * 2 * 2 * 2 * 16 * 4,  # 8 full caches of the tiny model
    ),
    "gpu": Shapes(
        parity_budget=64, parity_buffer=16, parity_prompt=32, parity_tokens=400,
        evict_layers=36, evict_kv_heads=8, evict_q_heads=32, evict_head_dim=128, evict_budget=1024,
        evict_buffer=128, evict_batches=(1, 16), evict_min_time=0.5, bandwidth_bytes=1 << 30,
        decode_model="qwen3-4b-random", decode_prompt=1024, decode_tokens=4096, decode_budget=2048,
        decode_buffer=64, decode_fixed_batch=32, decode_memory_share=0.8,
    ),
}  # fmt: skip

PARITY_MODEL = "tiny-qwen3"
PARITY_SEEDS = ((11, 22), (33, 44))


def run_gpu_check(device: str, shapes: Shapes, sections: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every section (or those named), each timed; a failing section records its error and the rest run."""
    from kvbench.provenance import describe_machine

    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "created": time.time(),
        "device": device,
        "machine": describe_machine(device),
        "shapes": asdict(shapes),
        "seconds": {},
        "errors": {},
    }
    steps: dict[str, Callable[[], Any]] = {
        "parity": lambda: parity_section(device, shapes),
        "event_cost": lambda: event_cost_section(device, shapes),
        "decode": lambda: decode_section(device, shapes, "sdpa"),
        "flash_attention": lambda: flash_attention_section(device, shapes),
    }
    for name, step in steps.items():
        if sections and name not in sections:
            continue
        started = time.perf_counter()
        try:
            report[name] = step()
        except Exception as exc:  # one broken section must not hide the others' results
            report[name] = None
            report["errors"][name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
        report["seconds"][name] = round(time.perf_counter() - started, 2)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    report["imports"] = imports_section()
    report["ok"] = verdict(report)
    return report


def verdict(report: dict[str, Any]) -> bool:
    """No section failed, every deterministic policy matched, every drawing one followed its seeds, and
    nothing was imported that the GPU node lacks."""
    if report["errors"] or report["imports"]["not_on_gpu_node"]:
        return False
    rows = (report.get("parity") or {}).get("policies", [])  # none when the section did not run
    return all(row["seeded"] if row["draws"] else row["equal"] for row in rows)


# -- parity -----------------------------------------------------------------------------------------
def parity_section(device: str, shapes: Shapes, reference: str = "cpu") -> dict[str, Any]:
    from kvbench.adapters.hf.calibrate import calibrate
    from kvbench.adapters.hf.models import load_model
    from kvbench.bench.parity import compare_traces, kept_trace
    from kvbench.core.schedule import Schedule
    from kvbench.registry import known_policies
    from kvbench.specs.model import load_model_spec

    spec = load_model_spec(PARITY_MODEL).model_copy(update={"dtype": "bfloat16"})
    on_reference = load_model(spec, device=reference, attention="sdpa")
    on_device = load_model(spec, device=device, attention="sdpa")
    gen = torch.Generator().manual_seed(0)
    vocab = len(on_reference.tokenizer)
    tokens = torch.randint(0, vocab, (shapes.parity_prompt + shapes.parity_tokens,), generator=gen).tolist()
    schedule = Schedule(budget=shapes.parity_budget, buffer=shapes.parity_buffer)
    calibration = calibrate(on_reference)
    seeds, others = PARITY_SEEDS
    rows = []
    for name, cls in known_policies().items():
        if not cls.evicts:
            continue

        def trace(loaded: Any, row_seeds: tuple[int, ...], name: str = name) -> tuple[Any, bool]:
            return kept_trace(loaded, tokens, shapes.parity_prompt, name, schedule, row_seeds, calibration)

        base, draws = trace(on_reference, seeds)
        first, _ = trace(on_device, seeds)
        against = compare_traces(base, first)
        row: dict[str, Any] = {"policy": name, "draws": draws, **asdict(against), "equal": against.equal}
        if draws:  # its own device's generators: the seed, not the device, must decide what it keeps
            again = compare_traces(first, trace(on_device, seeds)[0]).equal
            differs = not compare_traces(first, trace(on_device, others)[0]).equal
            alone, _ = trace(on_device, seeds[:1])
            row_alone = compare_traces([t[:, :1] for t in first], alone).equal
            row |= {
                "same_seed_same_kept": again,
                "other_seed_other_kept": differs,
                "row_independent": row_alone,
            }
            # a draw that seldom decides (vase-attnv's sampling at tiny shapes) may keep the same slots under
            # other seeds; the null's uniform draw always moves with its seed
            row["seeded"] = again and row_alone and (differs or name != "random")
        rows.append(row)
    return {
        "model": PARITY_MODEL,
        "dtype": "bfloat16",
        "attention": "sdpa",
        "reference_device": reference,
        "prompt_tokens": shapes.parity_prompt,
        "forced_tokens": shapes.parity_tokens,
        "budget": shapes.parity_budget,
        "buffer": shapes.parity_buffer,
        "row_seeds": list(seeds),
        "policies": rows,
    }


# -- event cost -------------------------------------------------------------------------------------
def event_cost_section(device: str, shapes: Shapes) -> dict[str, Any]:
    from kvbench.bench.evict import bench_evict

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    rows = bench_evict(
        None,
        batches=shapes.evict_batches,
        kv_heads=shapes.evict_kv_heads,
        q_heads=shapes.evict_q_heads,
        head_dim=shapes.evict_head_dim,
        budget=shapes.evict_budget,
        buffer=shapes.evict_buffer,
        prompt_len=min(256, shapes.evict_budget // 4),
        dtype=dtype,
        min_run_time=shapes.evict_min_time,
        layers=shapes.evict_layers,
        device=device,
        bandwidth_bytes=shapes.bandwidth_bytes,
    )
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "layers": shapes.evict_layers,
        "kv_heads": shapes.evict_kv_heads,
        "q_heads": shapes.evict_q_heads,
        "head_dim": shapes.evict_head_dim,
        "budget": shapes.evict_budget,
        "buffer": shapes.evict_buffer,
        "rows": [asdict(r) | {"paper_h200_ms": PAPER_H200_MS.get(r.policy)} for r in rows],
    }


# -- decode -----------------------------------------------------------------------------------------
@functools.cache
def _decode_model(name: str, device: str) -> Any:
    """The decode sections' model, built once (a 4B model's random init takes a while)."""
    from kvbench.adapters.hf.models import load_model

    return load_model(name, device=device)


def decode_section(device: str, shapes: Shapes, attention: str, iso_memory: bool = True) -> dict[str, Any]:
    from kvbench.adapters.hf.attention import kvbench_attention_name
    from kvbench.bench.decode import bench_decode

    loaded = _decode_model(shapes.decode_model, device)
    loaded.model.set_attn_implementation(kvbench_attention_name(attention))
    common: dict[str, Any] = dict(
        tokens=shapes.decode_tokens,
        budget=shapes.decode_budget,
        buffer=shapes.decode_buffer,
        prompt_tokens=shapes.decode_prompt,
        device=device,
        attention=attention,
        loaded=loaded,
    )
    per_sequence = kv_bytes_per_sequence(loaded.facts, loaded.model.dtype, shapes)
    memory = decode_memory(loaded, shapes)
    largest = {name: max(1, int(memory // need)) for name, need in per_sequence.items()}
    fixed_bound = {name: shapes.decode_fixed_batch >= largest[name] for name in largest}
    fixed = bench_decode(
        shapes.decode_model, ["random"], batch=shapes.decode_fixed_batch, memory_bound=fixed_bound, **common
    )
    iso, tries = None, 0
    while iso is None and iso_memory:
        try:
            iso = bench_decode(
                shapes.decode_model,
                ["random"],
                batch=largest,
                batching="iso-memory",
                memory_bound={name: True for name in largest},
                **common,
            )
        except torch.OutOfMemoryError:  # the estimate left too little for activations: a quarter less
            tries += 1
            largest = {name: max(1, batch * 3 // 4) for name, batch in largest.items()}
            torch.cuda.empty_cache()
            if tries > 4:
                raise
    iso = iso or []
    rows = [asdict(r) for r in [*fixed, *iso]]
    return {
        "model": shapes.decode_model,
        "attention": attention,
        "dtype": str(loaded.model.dtype).removeprefix("torch."),
        "kv_bytes_per_sequence": per_sequence,
        "kv_memory_bytes": memory,
        "largest_batch": largest,
        "oom_retries": tries,
        "rows": rows,
        "random_vs_full": {
            "fixed-batch": _ratio(fixed),
            **({"iso-memory": _ratio(iso)} if iso else {}),
        },
    }


def kv_bytes_per_sequence(facts: Any, dtype: torch.dtype, shapes: Shapes) -> dict[str, int]:
    """Peak KV bytes one sequence needs: the whole prompt and output for the full cache; for an evicting
    one twice K + B slots (an event holds the old and the compacted layers at once)."""
    per_token = 2 * facts.num_layers * facts.num_kv_heads * facts.head_dim * dtype.itemsize
    held = max(shapes.decode_budget, shapes.decode_prompt) + shapes.decode_buffer
    return {
        "full": (shapes.decode_prompt + shapes.decode_tokens) * per_token,
        "random": 2 * held * per_token,
    }


def decode_memory(loaded: Any, shapes: Shapes) -> int:
    """The bytes the iso-memory arms may fill: a share of the device's free memory after the weights, or
    the scale's stand-in on the CPU."""
    if shapes.decode_memory_cap is not None or loaded.device.type != "cuda":
        return shapes.decode_memory_cap or 1 << 30
    free, _ = torch.cuda.mem_get_info(loaded.device)
    return int(free * shapes.decode_memory_share)


def _ratio(rows: list[Any]) -> dict[str, float]:
    full, random = rows[0], rows[1]
    return {
        "tokens_per_second": random.tokens_per_second / full.tokens_per_second,
        "batch": random.batch / full.batch,
    }


def flash_attention_section(device: str, shapes: Shapes) -> dict[str, Any]:
    if importlib.util.find_spec("flash_attn") is None:
        return {"ran": False, "note": "skipped: flash_attn does not import here"}
    if not device.startswith("cuda"):
        return {"ran": False, "note": "skipped: flash-attention 2 runs on CUDA only"}
    rows = decode_section(device, shapes, "flash_attention_2", iso_memory=False)
    return {"ran": True, "note": "flash_attention_2 through transformers, the fixed batch only", **rows}


# -- imports ----------------------------------------------------------------------------------------
def _names(path: Path) -> set[str]:
    """Distribution names listed one per line (``name==version``, comments after #), normalised."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {_normal(text) for text in lines if text}


def _normal(requirement: str) -> str:
    """The normalised distribution name of a requirement (``name==version``, ``name[extra]``) or a name."""
    return re.sub(r"[-_.]+", "-", re.split(r"[=<>!~ ;\[]", requirement)[0]).lower()


REQUIREMENTS = Path("requirements")


def imports_section(requirements: Path = REQUIREMENTS) -> dict[str, Any]:
    """kvbench's own requirements this process imported, and those the GPU node would not have."""
    node = _names(requirements / "gpu-node.txt") | _names(requirements / "gpu-wheels.txt")
    declared = {_normal(r) for r in importlib.metadata.requires("kvbench") or [] if "extra ==" not in r}
    by_module = importlib.metadata.packages_distributions()
    imported = {
        _normal(dist)
        for module in list(sys.modules)
        if "." not in module
        for dist in by_module.get(module, [])
    }
    used = sorted(imported & declared)
    return {"kvbench_requirements_imported": used, "not_on_gpu_node": sorted(set(used) - node)}


# -- output -----------------------------------------------------------------------------------------
def machine_slug(report: dict[str, Any]) -> str:
    machine = report["machine"]
    name = machine.get("gpu") or f"cpu-{machine['cpu']}"
    return re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")


def write_report(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    from kvbench.bench.gpu_summary import summary
    from kvbench.store.atomic import atomic_write

    stem = out / machine_slug(report)
    json_path, text_path = stem.with_suffix(".json"), stem.with_suffix(".md")
    text = json.dumps(report, indent=2, default=str) + "\n"
    atomic_write(json_path, lambda temp: temp.write_text(text))
    atomic_write(text_path, lambda temp: temp.write_text(summary(report)))
    return json_path, text_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvbench.bench.gpu_check", description=__doc__)
    parser.add_argument("--device", default="cuda", help="cuda (the GPU node) or cpu (tiny shapes, CI)")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu-check"), help="folder for the report")
    parser.add_argument("--section", action="append", default=[], help="run only this section (repeatable)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu-check: torch {torch.__version__} sees no CUDA device: use DEVICE=cpu", file=sys.stderr)
        return 2
    shapes = SCALES["cpu" if args.device == "cpu" else "gpu"]
    report = run_gpu_check(args.device, shapes, tuple(args.section))
    json_path, text_path = write_report(report, args.out)
    print(text_path.read_text())
    print(f"report: {json_path}\nsummary: {text_path}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

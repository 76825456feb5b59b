"""The readable side of ``make gpu-check``'s report: markdown tables of each section, from the JSON alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Column = tuple[str, Callable[[dict[str, Any]], str]]
"""A table's header and how one row of the report's section reads in it."""


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f} MiB"


def _seeded(r: dict[str, Any]) -> str:
    if not r["draws"]:
        return "-"
    same, other, alone = r["same_seed_same_kept"], r["other_seed_other_kept"], r["row_independent"]
    return f"same seed {same}, other seed {other}, row alone {alone}"


PARITY_COLUMNS: list[Column] = [
    ("policy", lambda r: r["policy"]),
    ("kind", lambda r: "draws" if r["draws"] else "deterministic"),
    ("equal events", lambda r: f"{r['equal_events']}/{r['events']}"),
    ("kept agreement", lambda r: f"{r['kept_agreement']:.3f}"),
    ("equal", lambda r: str(r["equal"])),
    ("draws follow the seed", _seeded),
]
EVENT_COST_COLUMNS: list[Column] = [
    ("policy", lambda r: r["policy"]),
    ("batch", lambda r: str(r["batch"])),
    ("ms / event", lambda r: f"{r['ms_per_event']:.3f}"),
    ("× random", lambda r: f"{r['ratio_to_random']:.2f}"),
    ("copy floor ms", lambda r: f"{r['copy_floor_ms']:.3f}"),
    ("paper H200 ms", lambda r: "-" if r["paper_h200_ms"] is None else f"{r['paper_h200_ms']:.2f}"),
]
DECODE_COLUMNS: list[Column] = [
    ("policy", lambda r: r["policy"]),
    ("regime", lambda r: r["batching"]),
    ("memory", lambda r: "memory-bound" if r["memory_bound"] else "not memory-bound"),
    ("batch", lambda r: str(r["batch"])),
    ("tokens/s", lambda r: f"{r['tokens_per_second']:,.1f}"),
    ("× full", lambda r: f"{r['speed_vs_full']:.2f}"),
    ("events", lambda r: str(r["eviction_events"])),
    ("ms / event", lambda r: f"{r['ms_per_event']:.2f}"),
    ("barrier stall ms", lambda r: f"{r['barrier_stall_ms']:.2f}"),
    ("peak KV", lambda r: _mib(r["peak_kv_bytes"])),
    ("peak device", lambda r: _mib(r["peak_device_bytes"])),
]


def _table(columns: list[Column], rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(header for header, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row) for _, cell in columns) + " |" for row in rows]
    return "\n".join(lines)


def summary(report: dict[str, Any]) -> str:
    machine = report["machine"]
    where = machine.get("gpu") or f"CPU {machine['cpu']} ({machine['cpu_count']} cores)"
    parts = [
        f"# gpu-check on {where}",
        f"device {report['device']}, torch {machine['torch']} (CUDA {machine['torch_cuda']}); "
        f"verdict: {'OK' if report['ok'] else 'FAILED'}; seconds per section: {report['seconds']}",
    ]
    parity = report.get("parity")
    if parity:
        parts += [
            f"## Parity: kept positions on {report['device']} against {parity['reference_device']} "
            f"({parity['model']}, {parity['dtype']}, {parity['attention']}, K={parity['budget']}, "
            f"B={parity['buffer']}, {parity['forced_tokens']} teacher-forced tokens)",
            _table(PARITY_COLUMNS, parity["policies"]),
        ]
    cost = report.get("event_cost")
    if cost:
        parts += [
            f"## Event cost: {cost['layers']} layers, Hkv={cost['kv_heads']}, Hq={cost['q_heads']}, "
            f"D={cost['head_dim']}, K={cost['budget']}, B={cost['buffer']}, {cost['dtype']}",
            _table(EVENT_COST_COLUMNS, cost["rows"]),
        ]
    for key, title in (("decode", "Decode throughput"), ("flash_attention", "Flash-attention 2")):
        section = report.get(key)
        if section is None or not section.get("rows"):
            if section is not None:
                parts += [f"## {title}", section.get("note", "")]
            continue
        parts += [
            f"## {title}: {section['model']} ({section['dtype']}, {section['attention']}), "
            f"{section['rows'][0]['prompt_tokens']}-token prompt, {section['rows'][0]['tokens']} new tokens",
            _table(DECODE_COLUMNS, section["rows"]),
            f"random / full: {section['random_vs_full']}",
        ]
    imports = report["imports"]
    parts += [
        "## Imports",
        f"kvbench requirements imported: {', '.join(imports['kvbench_requirements_imported'])}; "
        f"not on the GPU node: {', '.join(imports['not_on_gpu_node']) or 'none'}",
    ]
    if report["errors"]:
        parts += [
            "## Errors",
            *[f"- {name}: {text.splitlines()[0]}" for name, text in report["errors"].items()],
        ]
    return "\n\n".join(parts) + "\n"

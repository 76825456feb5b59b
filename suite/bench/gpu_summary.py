"""The readable side of ``make gpu-check``'s report: markdown tables of each section, from the JSON alone."""

from __future__ import annotations

from typing import Any

DECODE_COLUMNS = ["policy", "regime", "memory", "batch", "tokens/s", "× full", "events", "ms / event",
                  "barrier stall ms", "peak KV", "peak device"]  # fmt: skip


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f} MiB"


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
        rows = []
        for r in parity["policies"]:
            seeded = (
                f"same seed {r['same_seed_same_kept']}, other seed {r['other_seed_other_kept']}, "
                f"row alone {r['row_independent']}"
                if r["draws"]
                else "-"
            )
            rows.append(
                [
                    r["policy"],
                    "draws" if r["draws"] else "deterministic",
                    f"{r['equal_events']}/{r['events']}",
                    f"{r['kept_agreement']:.3f}",
                    str(r["equal"]),
                    seeded,
                ]
            )
        parts += [
            f"## Parity: kept positions on {report['device']} against {parity['reference_device']} "
            f"({parity['model']}, {parity['dtype']}, {parity['attention']}, K={parity['budget']}, "
            f"B={parity['buffer']}, {parity['forced_tokens']} teacher-forced tokens)",
            _table(
                ["policy", "kind", "equal events", "kept agreement", "equal", "draws follow the seed"], rows
            ),
        ]
    cost = report.get("event_cost")
    if cost:
        rows = [
            [
                r["policy"],
                str(r["batch"]),
                f"{r['ms_per_event']:.3f}",
                f"{r['ratio_to_random']:.2f}",
                f"{r['copy_floor_ms']:.3f}",
                "-" if r["paper_h200_ms"] is None else f"{r['paper_h200_ms']:.2f}",
            ]
            for r in cost["rows"]
        ]
        parts += [
            f"## Event cost: {cost['layers']} layers, Hkv={cost['kv_heads']}, Hq={cost['q_heads']}, "
            f"D={cost['head_dim']}, K={cost['budget']}, B={cost['buffer']}, {cost['dtype']}",
            _table(["policy", "batch", "ms / event", "× random", "copy floor ms", "paper H200 ms"], rows),
        ]
    for key, title in (("decode", "Decode throughput"), ("flash_attention", "Flash-attention 2")):
        section = report.get(key)
        if section is None or not section.get("rows"):
            if section is not None:
                parts += [f"## {title}", section.get("note", "")]
            continue
        rows = [
            [
                r["policy"],
                r["batching"],
                "memory-bound" if r["memory_bound"] else "not memory-bound",
                str(r["batch"]),
                f"{r['tokens_per_second']:,.1f}",
                f"{r['speed_vs_full']:.2f}",
                str(r["eviction_events"]),
                f"{r['ms_per_event']:.2f}",
                f"{r['barrier_stall_ms']:.2f}",
                _mib(r["peak_kv_bytes"]),
                _mib(r["peak_device_bytes"]),
            ]
            for r in section["rows"]
        ]
        parts += [
            f"## {title}: {section['model']} ({section['dtype']}, {section['attention']}), "
            f"{section['rows'][0]['prompt_tokens']}-token prompt, {section['rows'][0]['tokens']} new tokens",
            _table(DECODE_COLUMNS, rows),
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

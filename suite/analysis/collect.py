"""`kvbench analyze values`: a model's cached keys and values over a probe's teacher-forced traces, and
the statistics of kvbench.analysis.values, stored as a tidy table.

Each problem's trace (the probe's prompt through the chat template, then its continuation) goes through
the model once with transformers' own cache, with no eviction. The layers' keys and values of all
problems are concatenated along the token axis before the statistics are taken.

The table is written to ``<out>/analysis/values-<id>.parquet``, one row per (model, task, layer, head,
statistic), with the settings and the machine in every row. Ingest loads it into the ``value_analysis``
table of the store.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from kvbench.analysis.values import Stat, layer_statistics


@dataclass
class Analysis:
    model: str
    task: str
    problems: int
    tokens: int
    settings: dict[str, Any]
    stats: list[Stat]
    device: str
    """Where the model ran (``cpu``, ``cuda:0``): the machine every row's provenance describes."""

    @property
    def analysis_id(self) -> str:
        text = json.dumps({"model": self.model, "task": self.task, **self.settings}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def collect(
    model: str,
    task: str,
    *,
    limit: int | None = 2,
    bits: tuple[int, ...] = (2, 4, 8),
    group: int = 32,
    above: float = 4.0,
    position_bins: int = 8,
    device: str = "cpu",
) -> Analysis:
    from kvbench.adapters.hf.backend import HFBackend
    from kvbench.adapters.hf.models import load_model
    from kvbench.errors import SpecError
    from kvbench.runner.probe_units import encode_problem, make_probe_problems
    from kvbench.specs.task import load_task

    spec = load_task(task)
    if spec.source.kind != "probe":
        raise SpecError(
            f"task {spec.name!r} is not a probe: `kvbench analyze values` reads teacher-forced probe traces "
            "(passkey, planted-fact, fidelity)"
        )
    loaded = load_model(model, device=device)
    backend = HFBackend(loaded)
    problems = make_probe_problems(spec.probe, limit, backend.encode)
    caches = []  # per problem: every layer's keys and values
    for problem in problems:
        prompt, continuation, _ = encode_problem(problem, backend)
        caches.append(_cache_of(loaded, prompt + continuation))
    settings = {"limit": limit, "bits": list(bits), "group": group, "above": above, "bins": position_bins}
    stats: list[Stat] = []
    for layer in range(len(caches[0][0])):
        layer_k = torch.cat([keys[layer] for keys, _ in caches], dim=1)
        layer_v = torch.cat([values[layer] for _, values in caches], dim=1)
        stats += layer_statistics(
            layer, layer_k, layer_v, bits=bits, group=group, above=above, position_bins=position_bins
        )
    tokens = sum(values[0].shape[1] for _, values in caches)
    return Analysis(loaded.spec.name, spec.name, len(problems), tokens, settings, stats, str(loaded.device))


@torch.inference_mode()
def _cache_of(loaded: Any, ids: list[int]) -> tuple[list[Tensor], list[Tensor]]:
    """Every layer's cached keys (post-RoPE) and values for one trace, [Hkv, T, D] each."""
    from transformers import DynamicCache

    cache = DynamicCache(config=loaded.model.config)
    loaded.model(
        input_ids=torch.tensor([ids], device=loaded.device), cache=cache, use_cache=True, logits_to_keep=1
    )
    layers: list[Any] = list(cache.layers)  # full-attention layers: each holds keys and values
    return [layer.keys[0].cpu() for layer in layers], [layer.values[0].cpu() for layer in layers]


def write_table(analysis: Analysis, out: Path) -> Path:
    """The tidy table, as ``<out>/analysis/values-<id>.parquet``, written whole by atomic rename."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kvbench.provenance import provenance
    from kvbench.store.atomic import atomic_write

    run = {"analysis_id": analysis.analysis_id, "created": time.time(), "model": analysis.model}
    run |= {"task": analysis.task, "problems": analysis.problems, "tokens": analysis.tokens}
    about = {"settings": json.dumps(analysis.settings, sort_keys=True)}
    about["provenance"] = json.dumps(provenance(analysis.device), default=str)
    rows = [{**run, **asdict(s), **about} for s in analysis.stats]  # layer, head, statistic, value
    path = out / "analysis" / f"values-{analysis.analysis_id}.parquet"
    atomic_write(path, lambda temp: pq.write_table(pa.Table.from_pylist(rows), temp))
    return path

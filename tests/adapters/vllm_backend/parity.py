"""The parity case shared by the hf side (which writes and guards the golden tokens) and the vLLM side.

Greedy decoding on tiny-qwen3-d64, K = 96, B = 8, a 40-token prompt and 300 new tokens: 30 eviction
events per sample, two samples per policy (their eviction seeds differ).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvbench.adapters.base import GREEDY
from kvbench.core.schedule import Schedule
from kvbench.registry import make_policy

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden" / "vllm-parity-tiny-qwen3-d64.json"
MODEL = "tiny-qwen3-d64"
PROMPT = "What is 2+2? Explain."
POLICIES = ("full", "streaming", "snapkv", "random", "rkv", "vase-attnv")
SCHEDULE = Schedule(budget=96, buffer=8)
SEEDS = (1, 2)
NEW_TOKENS = 300


def decode_all(backend: Any) -> dict[str, list[dict[str, Any]]]:
    """Each policy's samples: tokens and eviction events."""
    prompt = backend.prompt_ids(PROMPT)
    found = {}
    for name in POLICIES:
        generation = backend.generate(
            prompt,
            make_policy(name),
            SCHEDULE,
            sample_seeds=SEEDS,
            sampling=GREEDY,
            max_new_tokens=NEW_TOKENS,
        )
        found[name] = [{"tokens": s.tokens, "evictions": s.evictions} for s in generation.samples]
    return found


def golden() -> dict[str, list[dict[str, Any]]]:
    return json.loads(GOLDEN.read_text())["samples"]


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
        None if len(a) == len(b) else min(len(a), len(b)),
    )

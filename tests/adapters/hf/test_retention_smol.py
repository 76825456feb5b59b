"""Cross-head coverage on the embedded SmolLM2-135M (3 KV heads): random draws independently per KV head,
so its heads together cover more of the history than snapkv's, whose heads rank by attention from the
same recent queries."""

from __future__ import annotations

import pytest

from kvbench.adapters.hf.models import LoadedModel
from kvbench.adapters.hf.teacher import teacher_force
from kvbench.core.schedule import Schedule
from kvbench.probes.filler import filler_tokens
from kvbench.registry import make_policy


@pytest.mark.slow
def test_random_covers_more_of_the_history_across_heads_than_snapkv(smol: LoadedModel) -> None:
    import random

    text = filler_tokens(random.Random(3), lambda t: len(smol.tokenizer.encode(t)), 120)
    prompt = smol.tokenizer.encode("Think step by step.")
    continuation = smol.tokenizer.encode(text)
    schedule = Schedule(budget=48, buffer=8, protection="none")
    coverage = {}
    for name in ("random", "snapkv"):
        forced = teacher_force(smol, prompt, continuation, make_policy(name), schedule, row_seeds=[0])
        assert forced.eviction_events >= 5 and forced.retention is not None
        (retention,) = forced.retention
        assert retention is not None and len(retention.head_coverage) == smol.facts.num_layers
        coverage[name] = sum(retention.head_coverage) / len(retention.head_coverage)
    print(f"mean cross-head coverage over 30 layers: {coverage}")
    heads = smol.facts.num_kv_heads
    assert 1 / heads <= coverage["snapkv"] < coverage["random"] <= 1

"""Teacher forcing in B-token chunks equals token-by-token decoding, through the same eviction path."""

from __future__ import annotations

import pytest
import torch

from kvbench.adapters.base import Watch
from kvbench.adapters.hf.decode import generate
from kvbench.adapters.hf.models import LoadedModel
from kvbench.adapters.hf.teacher import teacher_force
from kvbench.core.engine import PinnedSlots
from kvbench.core.schedule import Schedule
from kvbench.registry import make_policy
from support import make_calibration

SCHEDULE = Schedule(budget=64, buffer=16)


def _continuation(length: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("name", ["random", "snapkv", "h2o", "vase-attnv", "rkv", "triattention", "full"])
def test_chunks_equal_token_by_token(tiny: LoadedModel, name: str) -> None:
    prompt, cont = tiny.prompt_ids("teacher forcing"), _continuation(300)
    policy, calibration = make_policy(name), make_calibration(tiny.facts)
    chunked = teacher_force(tiny, prompt, cont, policy, SCHEDULE, row_seeds=[3, 4], calibration=calibration)
    stepwise = teacher_force(
        tiny, prompt, cont, policy, SCHEDULE, row_seeds=[3, 4], calibration=calibration, chunk=1
    )
    fed = len(prompt) + len(cont) - 1  # the last token is only predicted
    expected_events = 0 if name == "full" else (fed - SCHEDULE.budget) // SCHEDULE.buffer
    assert chunked.eviction_events == stepwise.eviction_events == expected_events
    assert torch.allclose(chunked.logprobs, stepwise.logprobs, atol=1e-4, rtol=0)
    assert chunked.logprobs.shape == (2, 300)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["random", "h2o"])
def test_chunks_equal_token_by_token_smollm2(smol: LoadedModel, name: str) -> None:
    prompt, cont = smol.prompt_ids("Count slowly."), smol.tokenizer(" one two three four" * 60)["input_ids"]
    schedule = Schedule(budget=96, buffer=32)
    chunked = teacher_force(smol, prompt, cont, make_policy(name), schedule, row_seeds=[1])
    stepwise = teacher_force(smol, prompt, cont, make_policy(name), schedule, row_seeds=[1], chunk=1)
    assert chunked.eviction_events == stepwise.eviction_events > 2
    assert torch.allclose(chunked.logprobs, stepwise.logprobs, atol=1e-4, rtol=0)


def test_teacher_forcing_a_greedy_output_reproduces_it(tiny: LoadedModel) -> None:
    """Decode and teacher forcing share the eviction path: same seed, same events, same argmax."""
    prompt = tiny.prompt_ids("same path")
    decoded = generate(
        tiny, prompt, make_policy("random"), SCHEDULE, sample_seeds=[9], max_new_tokens=250, ignore_stop=True
    )
    tokens = decoded.samples[0].tokens
    forced = teacher_force(tiny, prompt, tokens, make_policy("random"), SCHEDULE, row_seeds=[9])
    assert forced.greedy_match.all()
    assert forced.eviction_events == decoded.eviction_events > 5


def test_reference_distribution_kl_and_top1(tiny: LoadedModel) -> None:
    prompt, cont = tiny.prompt_ids("reference"), _continuation(200, seed=1)
    same = teacher_force(tiny, prompt, cont, make_policy("full"), SCHEDULE, reference=True)
    assert same.kl_to_full.abs().max() < 1e-5 and same.top1_agrees_with_full.all()
    evicted = teacher_force(
        tiny, prompt, cont, make_policy("random"), SCHEDULE, row_seeds=[0, 1], reference=True
    )
    assert evicted.kl_to_full.shape == (2, 200)
    assert (evicted.kl_to_full >= -1e-6).all()
    before_first_event = 64 + 16 - len(prompt)
    assert evicted.kl_to_full[:, :before_first_event].abs().max() < 1e-5  # identical caches until then
    assert evicted.kl_to_full[:, before_first_event:].mean() > 0.01


@pytest.mark.parametrize("pin_first_head", [False, True])
def test_needle_survival_counts_the_watched_positions_held(tiny: LoadedModel, pin_first_head: bool) -> None:
    """Streaming keeps the protected prompt and the newest tokens, so which watched tokens the cache holds
    when the query begins follows from the schedule alone: K + B slots trigger an event that keeps K."""
    prompt, cont = tiny.prompt_ids("survival"), _continuation(300)
    budget, buffer, at = SCHEDULE.budget, SCHEDULE.buffer, 200
    seen = len(prompt) + at  # tokens in the cache the query's first token attends to
    stored = seen if seen < budget + buffer else budget + (seen - budget) % buffer
    window = range(seen - (stored - len(prompt)), seen)  # the newest tokens held beside the prompt
    needle = tuple(range(window.start - 3, window.start + 5))  # 3 evicted, 5 held
    heads = torch.tensor([pin_first_head, False])
    pinned = PinnedSlots(torch.tensor(needle), heads) if pin_first_head else None
    forced = teacher_force(
        tiny,
        prompt,
        cont,
        make_policy("streaming"),
        SCHEDULE,
        row_seeds=[0],
        pinned=pinned,
        watch=Watch(needle, at),
    )
    expected = torch.tensor([1.0 if pin_first_head else 5 / 8, 5 / 8]).expand(1, tiny.facts.num_layers, 2)
    assert torch.equal(forced.survival, expected)
    plain = teacher_force(
        tiny, prompt, cont, make_policy("streaming"), SCHEDULE, row_seeds=[0], pinned=pinned
    )
    assert plain.survival is None
    assert torch.allclose(plain.logprobs, forced.logprobs, atol=1e-4, rtol=0)  # the extra cut changes nothing

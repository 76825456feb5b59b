"""Teacher forcing in B-token chunks equals token-by-token decoding, through the same eviction path."""

from __future__ import annotations

import pytest
import torch

from kvbench.adapters.base import Watch
from kvbench.adapters.hf.decode import generate
from kvbench.adapters.hf.models import LoadedModel
from kvbench.adapters.hf.teacher import FullCacheMemo, teacher_force
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
    prompt, cont = smol.prompt_ids("Count slowly."), smol.tokenizer(" one two three four" * 30)["input_ids"]
    schedule = Schedule(budget=64, buffer=16)
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


def test_the_full_cache_runs_once_per_problem_and_the_next_policy_reads_it_bit_for_bit(
    tiny: LoadedModel,
) -> None:
    """Policies that share K and B share the full cache's chunks, so its predictions are made once per
    problem; another problem or another K makes them again. What a policy reads is what it would have
    computed itself, and what a plain forward over the whole sequence predicts."""
    prompt, cont = tiny.prompt_ids("one reference"), _continuation(200, seed=5)
    forwards = []
    hook = tiny.model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        memo = FullCacheMemo()

        def traced(name: str, schedule: Schedule = SCHEDULE, tokens: list[int] = cont, **kw: object) -> int:
            before = len(forwards)
            teacher_force(
                tiny, prompt, tokens, make_policy(name), schedule, row_seeds=[2], reference=True, **kw
            )
            return len(forwards) - before

        both = traced("snapkv", memo=memo)
        first = memo.logprobs
        policy_only = traced("random", memo=memo)
        assert memo.logprobs is first is not None  # read, not made again
        assert both == 2 * policy_only and policy_only > 10
        assert traced("random") == 2 * policy_only  # without the memo: the full cache runs beside it
        other_k = traced("h2o", Schedule(budget=80, buffer=16), memo=memo)
        assert other_k == 2 * policy_only  # another K
        traced("h2o", tokens=cont[:150], memo=memo)  # another problem
        assert memo.logprobs is not None and memo.logprobs.shape[1] == 150
    finally:
        hook.remove()

    shared, alone = FullCacheMemo(), None
    teacher_force(
        tiny, prompt, cont, make_policy("snapkv"), SCHEDULE, row_seeds=[2], reference=True, memo=shared
    )
    read = teacher_force(
        tiny, prompt, cont, make_policy("h2o"), SCHEDULE, row_seeds=[2], reference=True, memo=shared
    )
    alone = teacher_force(tiny, prompt, cont, make_policy("h2o"), SCHEDULE, row_seeds=[2], reference=True)
    assert torch.equal(read.kl_to_full, alone.kl_to_full)
    assert torch.equal(read.top1_agrees_with_full, alone.top1_agrees_with_full)
    with torch.inference_mode():
        whole = tiny.model(input_ids=torch.tensor([prompt + cont[:-1]])).logits.float().log_softmax(-1)
    assert shared.logprobs is not None
    assert torch.allclose(shared.logprobs[0], whole[0, len(prompt) - 1 :], atol=1e-4, rtol=0)


def test_the_full_arm_is_its_own_reference(tiny: LoadedModel) -> None:
    """The full arm's stream is the full cache's: compared with itself, not run twice."""
    prompt, cont = tiny.prompt_ids("itself"), _continuation(120, seed=6)
    forwards = []
    hook = tiny.model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        forced = teacher_force(
            tiny, prompt, cont, make_policy("full"), SCHEDULE, row_seeds=[1], reference=True
        )
        with_reference = len(forwards)
        teacher_force(tiny, prompt, cont, make_policy("full"), SCHEDULE, row_seeds=[1])
    finally:
        hook.remove()
    assert with_reference == len(forwards) - with_reference > 5
    assert forced.kl_to_full is not None and forced.top1_agrees_with_full is not None
    assert float(forced.kl_to_full.abs().max()) == 0.0 and bool(forced.top1_agrees_with_full.all())

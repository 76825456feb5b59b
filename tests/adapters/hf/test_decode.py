"""kvbench's decode loop inside real models: equal to transformers where it must be, evicting as it must."""

from __future__ import annotations

import pytest
import torch

from kvbench.adapters.base import Sampling
from kvbench.adapters.hf.cache import EvictingCache, make_cache
from kvbench.adapters.hf.decode import generate
from kvbench.adapters.hf.models import LoadedModel
from kvbench.core.schedule import Schedule
from kvbench.errors import BudgetError, CapabilityError
from kvbench.registry import known_policies, make_policy

SAMPLING = Sampling(temperature=0.6, top_p=0.95)
EVICTING = [name for name, cls in known_policies().items() if cls.evicts]


def _reference_greedy(loaded: LoadedModel, prompt: list[int], tokens: int) -> list[int]:
    """transformers' own generate, on its own sdpa attention and DynamicCache."""
    attention = loaded.model.config._attn_implementation
    loaded.model.set_attn_implementation("sdpa")
    try:
        out = loaded.model.generate(
            torch.tensor([prompt]), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False
        )
    finally:
        loaded.model.set_attn_implementation(attention)
    return out[0, len(prompt) :].tolist()


def _full_greedy(loaded: LoadedModel, prompt: list[int], tokens: int) -> list[int]:
    result = generate(
        loaded,
        prompt,
        make_policy("full"),
        Schedule(budget=64, buffer=16),
        sample_seeds=[0],
        max_new_tokens=tokens,
        ignore_stop=True,
    )
    return result.samples[0].tokens


def test_full_greedy_equals_transformers_generate_tiny(tiny: LoadedModel) -> None:
    prompt = tiny.prompt_ids("Full cache, greedy: the same tokens as model.generate.")
    ours = _full_greedy(tiny, prompt, 120)
    assert ours == _reference_greedy(tiny, prompt, 120)
    assert len(set(ours)) > 20  # the tiny model's output depends on its context


@pytest.mark.slow
def test_full_greedy_equals_transformers_generate_smollm2(smol: LoadedModel) -> None:
    prompt = smol.prompt_ids("List three facts about the moon.")
    assert _full_greedy(smol, prompt, 48) == _reference_greedy(smol, prompt, 48)


@pytest.mark.parametrize("name", EVICTING)
def test_a_budget_larger_than_everything_changes_nothing(tiny: LoadedModel, name: str) -> None:
    from support import make_calibration

    prompt = tiny.prompt_ids("No eviction should ever happen here.")
    seeds = [5, 6]
    kwargs = {"sample_seeds": seeds, "sampling": SAMPLING, "max_new_tokens": 80, "ignore_stop": True}
    big = Schedule(budget=len(prompt) + 80 + 16, buffer=16)
    full = generate(tiny, prompt, make_policy("full"), big, **kwargs)
    policy = generate(
        tiny, prompt, make_policy(name), big, calibration=make_calibration(tiny.facts), **kwargs
    )
    assert policy.eviction_events == 0
    assert [s.tokens for s in policy.samples] == [s.tokens for s in full.samples]


@pytest.mark.parametrize("name", ["random", "snapkv", "h2o", "vase-attnv", "streaming"])
def test_long_generation_keeps_the_schedule(tiny: LoadedModel, name: str) -> None:
    budget, buffer, steps = 128, 32, 600
    prompt = tiny.prompt_ids("A long generation under a small budget.")
    lengths_after_events, violations = [], []

    def check(cache: EvictingCache) -> None:
        for layer in cache.layers:
            kv = layer.kv
            if not budget <= kv.length < budget + buffer and cache.seen > budget + buffer:
                violations.append((cache.seen, kv.length))
            if not torch.equal(kv.positions[..., -1], torch.full_like(kv.positions[..., -1], cache.seen - 1)):
                violations.append(("last position", cache.seen))
        if cache.evictor.stats.events > len(lengths_after_events):
            lengths_after_events.append([layer.kv.length for layer in cache.layers])

    final: list[EvictingCache] = []
    result = generate(
        tiny,
        prompt,
        make_policy(name),
        Schedule(budget=budget, buffer=buffer),
        sample_seeds=[1, 2],
        sampling=SAMPLING,
        max_new_tokens=steps,
        ignore_stop=True,
        on_step=lambda cache: (check(cache), final[:] or final.append(cache)),
    )
    assert not violations
    assert result.eviction_events == len(lengths_after_events) == (len(prompt) + steps - budget) // buffer
    assert all(lengths == [budget] * tiny.facts.num_layers for lengths in lengths_after_events)
    cache = final[0]
    for layer in cache.layers:  # the protected prompt is still there, in every head and row
        assert torch.equal(layer.kv.positions[..., : len(prompt)], torch.arange(len(prompt)).expand(2, 2, -1))

    # RoPE: kept layer-0 keys equal a full-cache forward's keys at the same positions (layer 0's keys depend
    # on the token and its position only), so every token was rotated at its true position.
    tokens = torch.tensor([prompt + result.samples[0].tokens[:-1]])
    full = make_cache(
        tiny,
        make_policy("full"),
        Schedule(budget=64, buffer=16),
        prompt_len=len(prompt),
        row_seeds=[0],
        total_tokens=tokens.shape[1],
    )
    with torch.no_grad():
        tiny.model(input_ids=tokens, cache=full, kvbench_cache=full, use_cache=True, logits_to_keep=1)
    kept = cache.layers[0].kv
    reference = torch.gather(
        full.layers[0].kv.keys, 2, kept.positions[:1].unsqueeze(-1).expand(-1, -1, -1, 16)
    )
    assert torch.allclose(kept.keys[:1], reference, atol=1e-5)


def test_same_seed_same_samples_other_seed_other_samples(tiny: LoadedModel) -> None:
    prompt = tiny.prompt_ids("Seeds decide everything.")
    schedule = Schedule(budget=48, buffer=16)

    def run(seeds: list[int]) -> list[list[int]]:
        out = generate(
            tiny,
            prompt,
            make_policy("random"),
            schedule,
            sample_seeds=seeds,
            sampling=SAMPLING,
            max_new_tokens=100,
            ignore_stop=True,
        )
        return [s.tokens for s in out.samples]

    first = run([1, 2])
    assert first == run([1, 2])
    assert first[0] != first[1]
    assert run([3, 4]) != first


def _three_rows(tiny: LoadedModel, text: str, seeds: list[int], tokens: int, **stops):
    """Three sampled rows of one prompt under random eviction: with ``stops``, and free (no stop at all)."""
    prompt = tiny.prompt_ids(text)
    schedule = Schedule(budget=48, buffer=16)
    common = {"sampling": SAMPLING, "max_new_tokens": tokens, "sample_seeds": seeds}
    free = generate(tiny, prompt, make_policy("random"), schedule, ignore_stop=True, **common)
    stopped = generate(tiny, prompt, make_policy("random"), schedule, **stops, **common) if stops else None
    return free, stopped


def test_a_row_that_stops_early_leaves_the_others_unchanged(tiny: LoadedModel) -> None:
    free, _ = _three_rows(tiny, "Three samples; one stops early.", [11, 12, 13], 120)
    rows = [s.tokens for s in free.samples]
    # a token that row 1 emits early and the other rows never emit: make it the stop token
    stop = next(t for t in rows[1][5:40] if t not in rows[0] and t not in rows[2])
    _, stopped = _three_rows(tiny, "Three samples; one stops early.", [11, 12, 13], 120, stop_ids=[stop])
    short = stopped.samples[1]
    assert short.finish_reason == "stop" and short.tokens == rows[1][: rows[1].index(stop) + 1]
    assert [stopped.samples[0].tokens, stopped.samples[2].tokens] == [rows[0], rows[2]]
    assert {s.finish_reason for s in (stopped.samples[0], stopped.samples[2])} == {"length"}
    alone, _ = _three_rows(tiny, "Three samples; one stops early.", [13], 120)
    assert alone.samples[0].tokens == rows[2]


def test_a_stop_string_ends_its_row_where_it_first_appears(tiny: LoadedModel) -> None:
    text, seeds = "Three samples; one meets a stop string.", [21, 22, 23]
    free, _ = _three_rows(tiny, text, seeds, 100)
    texts = [tiny.tokenizer.decode(s.tokens) for s in free.samples]
    # two printable characters of row 0 that the other rows never write: make them the stop string
    stop = next(
        texts[0][i : i + 2]
        for i in range(10, 60)
        if texts[0][i : i + 2].isprintable() and all(texts[0][i : i + 2] not in t for t in texts[1:])
    )
    _, stopped = _three_rows(tiny, text, seeds, 100, stop_strings=[stop])
    first = stopped.samples[0]
    # the row ends on the token that completes the stop string, and its text stops before it
    end = next(n for n in range(1, 101) if stop in tiny.tokenizer.decode(free.samples[0].tokens[:n]))
    assert first.finish_reason == "stop" and first.tokens == free.samples[0].tokens[:end]
    assert first.text == texts[0][: texts[0].index(stop)]
    assert [s.tokens for s in stopped.samples[1:]] == [s.tokens for s in free.samples[1:]]
    assert stopped.settings["stop_strings"] == [stop]


def test_a_policy_needing_queries_on_an_unrecorded_attention_is_refused(tiny: LoadedModel) -> None:
    tiny.model.set_attn_implementation("sdpa")
    try:
        with pytest.raises(CapabilityError, match=r"'snapkv' needs queries.*runs 'sdpa'"):
            generate(tiny, [1, 2, 3], make_policy("snapkv"), Schedule(budget=32, buffer=8), sample_seeds=[0])
    finally:
        tiny.model.set_attn_implementation("kvbench_sdpa")


def test_a_budget_too_small_for_the_prompt_is_refused_with_both_numbers(tiny: LoadedModel) -> None:
    prompt = list(range(40))
    with pytest.raises(
        BudgetError, match="protect 23 prompt tokens, but the prompt has 40: use a budget of at least 49"
    ):
        generate(
            tiny,
            prompt,
            make_policy("random"),
            Schedule(budget=32, buffer=8),
            sample_seeds=[0],
            refuse_capped_prompt=True,
        )


def test_peak_kv_memory_stays_flat_under_eviction(tiny: LoadedModel) -> None:
    prompt = tiny.prompt_ids("memory")
    schedule = Schedule(budget=64, buffer=16)
    kwargs = {"sample_seeds": [0], "max_new_tokens": 400, "ignore_stop": True}
    full = generate(tiny, prompt, make_policy("full"), schedule, **kwargs)
    evicting = generate(tiny, prompt, make_policy("random"), schedule, **kwargs)
    per_slot = 2 * tiny.facts.num_layers * tiny.facts.num_kv_heads * tiny.facts.head_dim * 4  # K and V, fp32
    assert evicting.peak_kv_bytes == per_slot * (64 + 16)  # measured as the event fires
    assert full.peak_kv_bytes == per_slot * (len(prompt) + 399)  # the last sampled token is never fed


def test_a_stop_string_spelled_in_more_tokens_than_its_own_encoding_is_still_seen(tiny: LoadedModel) -> None:
    """A model may write a stop string in other tokens than the tokenizer's own encoding of it: here
    `<|im_end|>` (one special token) written character by character. The per-step check looks back far
    enough for any spelling: every token writes at least one byte."""
    from kvbench.adapters.hf.decode import StopStrings

    stop = "<|im_end|>"
    spelled = [t for ch in stop for t in tiny.tokenizer.encode(ch, add_special_tokens=False)]
    assert len(spelled) > len(tiny.tokenizer.encode(stop, add_special_tokens=False)) + 2
    prefix = tiny.tokenizer.encode("The answer is 4.", add_special_tokens=False)
    assert tiny.tokenizer.decode(prefix + spelled) == "The answer is 4." + stop
    assert StopStrings(tiny.tokenizer, [stop]).reached(prefix + spelled)
    assert not StopStrings(tiny.tokenizer, [stop]).reached(prefix + spelled[:-1])

"""The mixed-precision cache inside a real transformers model: exactness where nothing is quantized, the
same events chunked or token by token, the byte budget held, and eviction draws untouched by precision."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvbench.adapters.hf.cache import make_cache
from kvbench.adapters.hf.decode import generate
from kvbench.adapters.hf.models import LoadedModel
from kvbench.adapters.hf.teacher import teacher_force
from kvbench.core.mixed_kv import MixedLayerKV
from kvbench.core.precision import MixedPrecision
from kvbench.core.schedule import Schedule
from kvbench.registry import make_policy

EVICTING = Schedule(budget=64, buffer=16)


def _continuation(length: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _with(precision: MixedPrecision, schedule: Schedule = EVICTING, unit: str = "tokens") -> Schedule:
    return dataclasses.replace(schedule, precision=precision, budget_unit=unit)


@pytest.mark.parametrize("policy", ["random", "snapkv", "full"])
def test_with_every_token_in_high_precision_the_outputs_are_the_unquantized_caches(
    tiny: LoadedModel, policy: str
) -> None:
    prompt, cont = tiny.prompt_ids("mixed"), _continuation(200)
    plain = teacher_force(tiny, prompt, cont, make_policy(policy), EVICTING, row_seeds=[1, 2])
    roomy = _with(MixedPrecision(bits=2, group=8, high_precision=10_000))
    mixed = teacher_force(tiny, prompt, cont, make_policy(policy), roomy, row_seeds=[1, 2])
    # equal up to float rounding: the two caches hold the same values in differently laid-out tensors, and
    # on CPUs with AVX-512 (BF16) torch's attention kernels pick their blocking by layout, which moves the
    # last bits (2.9e-6 at most, measured on an AMD EPYC with avx512_bf16; bit for bit on the machine this
    # test was first written on)
    assert torch.allclose(plain.logprobs, mixed.logprobs, atol=1e-5, rtol=0)
    assert plain.eviction_events == mixed.eviction_events
    quantized = _with(MixedPrecision(bits=2, group=8, high_precision=0))
    lossy = teacher_force(tiny, prompt, cont, make_policy(policy), quantized, row_seeds=[1, 2])
    assert not torch.allclose(plain.logprobs, lossy.logprobs, atol=1e-3)  # the test can tell


def test_decoding_with_every_token_in_high_precision_writes_the_same_text(tiny: LoadedModel) -> None:
    prompt = tiny.prompt_ids("decode")
    roomy = _with(MixedPrecision(bits=4, group=8, high_precision=10_000))
    plain = generate(tiny, prompt, make_policy("h2o"), EVICTING, max_new_tokens=120, sample_seeds=[5])
    mixed = generate(tiny, prompt, make_policy("h2o"), roomy, max_new_tokens=120, sample_seeds=[5])
    assert plain.samples[0].tokens == mixed.samples[0].tokens
    assert plain.eviction_events == mixed.eviction_events > 0


@pytest.mark.parametrize("demote", ["oldest", "smallest-range"])
@pytest.mark.parametrize("policy", ["random", "h2o", "vase-attnv", "full"])
def test_chunks_equal_token_by_token_under_mixed_precision(
    tiny: LoadedModel, policy: str, demote: str
) -> None:
    prompt, cont = tiny.prompt_ids("chunks"), _continuation(260, seed=1)
    schedule = _with(MixedPrecision(bits=4, group=8, high_precision=8, demote=demote))
    chunked = teacher_force(tiny, prompt, cont, make_policy(policy), schedule, row_seeds=[3, 4])
    stepwise = teacher_force(tiny, prompt, cont, make_policy(policy), schedule, row_seeds=[3, 4], chunk=1)
    assert chunked.eviction_events == stepwise.eviction_events
    # a value 1e-7 from a rounding boundary may take the next 4-bit code in one of the two: a difference
    # of one quantization step in one channel, far below what a different demotion choice makes (~0.1).
    # How far it moves a log-probability depends on the CPU's kernels: under 1e-3 on an AMD EPYC, up to
    # 3.3e-3 on an Intel Xeon with AMX (8 of 520 values above 1e-3), so the bound sits between the two.
    assert torch.allclose(chunked.logprobs, stepwise.logprobs, atol=1e-2, rtol=0)


def test_random_draws_are_the_same_with_and_without_quantization(tiny: LoadedModel) -> None:
    """The null's eviction draws depend on seeds, layer and event only: quantizing the cache keeps them."""
    prompt, cont = tiny.prompt_ids("seeds"), _continuation(150, seed=2)
    held = {}
    for name, schedule in {
        "plain": EVICTING,
        "4-bit": _with(MixedPrecision(bits=4, group=8, high_precision=4)),
    }.items():
        cache = make_cache(
            tiny, make_policy("random"), schedule, prompt_len=len(prompt), row_seeds=[7, 8], total_tokens=300
        )
        ids = torch.tensor([prompt + cont])
        tiny.model(input_ids=ids, cache=cache, kvbench_cache=cache, use_cache=True)
        cache.repeat_prompt_row(2)
        while not cache.evict_if_due():  # step until the first eviction
            step = torch.tensor([[1], [1]])
            tiny.model(input_ids=step, cache=cache, kvbench_cache=cache, use_cache=True)
        held[name] = [layer.slots.positions.sort(dim=-1).values for layer in cache.evicting_layers]
        if name == "4-bit":
            assert all(isinstance(layer.slots, MixedLayerKV) for layer in cache.evicting_layers)
            assert all(layer.slots.quantized > 0 for layer in cache.evicting_layers)
    for plain, mixed in zip(held["plain"], held["4-bit"], strict=True):
        assert torch.equal(plain, mixed)
        assert not torch.equal(plain[0], plain[1])  # rows draw differently


def test_a_byte_budget_is_held_after_every_event_and_recorded(tiny: LoadedModel) -> None:
    prompt, cont = tiny.prompt_ids("bytes"), _continuation(400, seed=3)
    precision = MixedPrecision(bits=4, group=8, high_precision=8)
    schedule = _with(precision, Schedule(budget=64, buffer=16, budget_multiple_of_buffer=True), "bytes")
    cache = make_cache(
        tiny, make_policy("snapkv"), schedule, prompt_len=len(prompt), row_seeds=[0], total_tokens=500
    )
    facts = tiny.facts
    full_token = 2 * facts.head_dim * 4 * facts.num_layers * facts.num_kv_heads  # fp32 keys and values
    assert cache.budget is not None
    # head dim 16 at 4 bits in groups of 8: 2 groups of 4 code bytes + fp16 scale and offset = 16 bytes
    packed_token = 2 * 16 * facts.num_layers * facts.num_kv_heads
    tokens = cache.budget.tokens
    assert tokens == (24 + (64 - 24) * full_token // packed_token) // 16 * 16
    assert cache.budget.bytes == 24 * full_token + (tokens - 24) * packed_token <= 64 * full_token
    ids = torch.tensor([prompt])
    tiny.model(input_ids=ids, cache=cache, kvbench_cache=cache, use_cache=True)
    footprints = []
    for token in cont:
        tiny.model(input_ids=torch.tensor([[token]]), cache=cache, kvbench_cache=cache, use_cache=True)
        if cache.evict_if_due():
            footprints.append((cache.kv_bytes(), cache.stored))
    assert len(footprints) >= 3
    # right after every event: K tokens, N_hp + B of them in fp32, the rest packed
    assert footprints == [(cache.budget.bytes, tokens)] * len(footprints)
    assert cache.peak_bytes == cache.budget.bytes + 16 * full_token  # K + B slots, B new ones in fp32

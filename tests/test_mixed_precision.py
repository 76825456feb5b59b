"""The mixed-precision cache's parts on synthetic tensors: packing, error bounds, bytes, demotion order."""

from __future__ import annotations

import pytest
import torch

from kvbench.core.layer_kv import LayerKV
from kvbench.core.mixed_kv import MixedLayerKV
from kvbench.core.precision import MixedPrecision, TokenCost, footprint, tokens_for_bytes
from kvbench.core.quantize import RowQuantizer
from kvbench.core.schedule import Schedule
from kvbench.errors import BudgetError


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_quantization_error_is_at_most_half_a_step_of_each_group(bits: int) -> None:
    x = torch.randn(3, 2, 40, 64, generator=torch.Generator().manual_seed(bits)) * 5
    x[0, 0, 7] *= 100  # a planted large-range token: its own groups' steps, nobody else's
    quantizer = RowQuantizer(bits, 32)
    restored = quantizer.unpack(quantizer.pack(x), torch.float32)
    groups, back = x.reshape(-1, 32), restored.reshape(-1, 32)
    step = (groups.amax(dim=-1) - groups.amin(dim=-1)) / (2**bits - 1)
    # half a step, plus the rounding of the stored fp16 scale and offset (fp32 for 8 bits)
    params_eps = 2**-10 if bits < 8 else 2**-23
    slack = step * 2**bits * params_eps + groups.abs().amax(dim=-1) * params_eps
    error = (groups - back).abs().amax(dim=-1)
    assert bool((error <= step / 2 + slack).all())
    assert float(error.max()) > 0  # the bound is not met by a copy
    # a group's minimum is its offset, stored, so it comes back (up to the offset's rounding)
    assert torch.allclose(back.amin(dim=-1), groups.amin(dim=-1), rtol=params_eps, atol=1e-6)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_tensor_ops_write_the_same_bytes_as_torchs_row_wise_ops(bits: int) -> None:
    x = torch.randn(2, 3, 9, 64, generator=torch.Generator().manual_seed(0))
    quantizer = RowQuantizer(bits, 32)
    by_torch, by_tensor_ops = quantizer.pack(x), quantizer.pack(x, tensor_ops=True)
    assert by_torch.dtype == torch.uint8
    assert by_torch.shape == (2, 3, 9, 2 * (32 * bits // 8 + (8 if bits == 8 else 4)))
    assert torch.equal(by_torch, by_tensor_ops)
    assert torch.allclose(
        quantizer.unpack(by_torch, torch.float32),
        quantizer.unpack(by_torch, torch.float32, tensor_ops=True),
        atol=1e-6,
    )


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_tensor_ops_write_the_same_bytes_for_flat_and_narrow_groups(bits: int) -> None:
    # A constant group (range 0) and a group whose range is near float32's resolution: the 8-bit op keeps a
    # zero scale and divides by range + 1e-8, which a division by the scale does not reproduce.
    narrow = 1e-6 * torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    x = torch.cat([torch.full((1, 64), 1.5), torch.zeros(1, 64), narrow])
    quantizer = RowQuantizer(bits, 32)
    assert torch.equal(quantizer.pack(x), quantizer.pack(x, tensor_ops=True))


def test_a_group_that_does_not_divide_the_head_dimension_is_refused() -> None:
    with pytest.raises(ValueError, match="does not divide the head dimension 48"):
        RowQuantizer(4, 32).pack(torch.zeros(1, 48))


def _mixed(values: torch.Tensor, precision: MixedPrecision, buffer: int) -> MixedLayerKV:
    """A cache of [B, H, S, D] values (keys = values), positions 0..S-1."""
    batch, heads, slots, _ = values.shape
    positions = torch.arange(slots).expand(batch, heads, slots).clone()
    return MixedLayerKV(LayerKV(values.clone(), values.clone(), positions), precision, buffer)


def _demote(cache: MixedLayerKV) -> MixedLayerKV:
    every = torch.arange(cache.length).expand_as(cache.positions)
    return cache.compacted(every)


def _high_positions(cache: MixedLayerKV, head: int = 0) -> set[int]:
    return set(cache.positions[0, head][cache.high_precision[0, head]].tolist())


def _spiky_values(ranges: list[float], dim: int = 16) -> torch.Tensor:
    """[1, 1, S, dim] values whose Range(v) is exactly ``ranges[s]``."""
    values = torch.zeros(1, 1, len(ranges), dim)
    values[0, 0, :, 0] = torch.tensor(ranges)
    return values


def test_smallest_range_keeps_the_largest_ranges_and_never_promotes_back() -> None:
    precision = MixedPrecision(bits=4, group=8, high_precision=2, demote="smallest-range")
    ranges = [1.0, 9.0, 2.0, 8.0, 3.0, 1.5, 0.5, 0.25]  # positions 0..7; the buffer is the last 2
    cache = _demote(_mixed(_spiky_values(ranges), precision, buffer=2))
    assert _high_positions(cache) == {1, 3, 6, 7}  # ranges 9 and 8, and the buffer
    assert cache.quantized == 4 and cache.length == 8
    for position, spike in ((8, 20.0), (9, 0.1), (10, 0.0), (11, 0.0)):
        new = _spiky_values([spike])
        cache.append(new, new, torch.tensor([[[position]]]))
        if position % 2:
            cache = _demote(cache)
    # 20.0 left the buffer and outranks 8.0, which is demoted; 9.0 stays whatever its age
    assert _high_positions(cache) == {1, 8, 10, 11}
    # 8.0 is now the largest range outside the set, but a quantized token is never promoted back
    for position in (12, 13):
        new = _spiky_values([0.0])
        cache.append(new, new, torch.tensor([[[position]]]))
    cache = _demote(cache)
    assert _high_positions(cache) == {1, 8, 12, 13}
    assert cache.positions[0, 0].tolist() == [0, 2, 3, 4, 5, 6, 7, 9, 10, 11, 1, 8, 12, 13]


def test_oldest_demotion_sheds_the_oldest_member_when_a_larger_range_arrives() -> None:
    precision = MixedPrecision(bits=4, group=8, high_precision=2, demote="oldest")
    cache = _demote(_mixed(_spiky_values([5.0, 9.0, 1.0, 6.0, 0.5, 0.2]), precision, buffer=2))
    assert _high_positions(cache) == {1, 3, 4, 5}  # the two largest ranges, then the buffer
    # positions 4 and 5 leave the buffer; 5 has range 7 (> member 6.0's): it joins and the oldest member,
    # position 1 with the largest range of all, is the one demoted
    assert cache.full.positions[0, 0].tolist() == [1, 3, 4, 5]
    cache.full.values[0, 0, 3, 0] = 7.0  # position 5's value, in place in the full-precision store
    late = _spiky_values([0.3, 0.1])
    cache.append(late, late, torch.tensor([[[6, 7]]]))
    cache = _demote(cache)
    assert _high_positions(cache) == {3, 5, 6, 7}
    # position 1 is quantized for good: a later demotion never brings it back
    calm = _spiky_values([0.0, 0.0])
    cache.append(calm, calm, torch.tensor([[[8, 9]]]))
    cache = _demote(cache)
    assert 1 not in _high_positions(cache)
    assert _high_positions(cache) == {3, 5, 8, 9}


def test_the_footprint_counted_is_the_bytes_the_cache_tensors_hold() -> None:
    precision = MixedPrecision(bits=4, group=16, high_precision=5)
    values = torch.randn(2, 3, 40, 64, generator=torch.Generator().manual_seed(1))
    cache = _demote(_mixed(values, precision, buffer=8))
    quantized, high = 40 - 5 - 8, 5 + 8
    assert cache.quantized == quantized and cache.full.length == high
    # by hand: 4 groups of 16 channels per vector, each 8 code bytes + fp16 scale + fp16 offset
    packed_vector = 4 * (8 + 2 + 2)
    per_row_head = high * 2 * 64 * 4 + quantized * 2 * packed_vector  # fp32 keys and values
    assert cache.nbytes == 2 * 3 * per_row_head
    # the packed stores hold exactly that, with no spare capacity behind them
    for store in (cache.packed_keys, cache.packed_values):
        assert store.untyped_storage().nbytes() == 2 * 3 * quantized * packed_vector
    cost = TokenCost.of(64, 4, precision)
    assert (cost.full, cost.quantized) == (2 * 64 * 4, 2 * packed_vector)
    assert cache.nbytes == 2 * 3 * footprint(40, 8, cost, precision)


def test_a_byte_budget_holds_the_most_tokens_whose_footprint_fits_it() -> None:
    precision = MixedPrecision(bits=4, group=32, high_precision=32)
    cost = TokenCost.of(128, 2, precision)  # bf16, head dim 128: 512 bytes vs 2 * 4 * 20 = 160
    assert (cost.full, cost.quantized) == (512, 160)
    budget = 1024 * cost.full
    tokens = tokens_for_bytes(1024, 64, cost, precision)
    assert footprint(tokens, 64, cost, precision) <= budget < footprint(tokens + 1, 64, cost, precision)
    assert tokens == 96 + (1024 - 96) * 512 // 160
    on_buffer = tokens_for_bytes(1024, 64, cost, precision, multiple=64)
    assert on_buffer % 64 == 0 and tokens - 64 < on_buffer <= tokens
    assert tokens_for_bytes(1024, 64, cost, None) == 1024
    with pytest.raises(BudgetError, match="lower high_precision or raise the budget"):
        tokens_for_bytes(96, 64, cost, precision)


def test_a_schedule_in_bytes_becomes_tokens_and_one_in_tokens_stays() -> None:
    precision = MixedPrecision(bits=2, group=32, high_precision=0)
    cost = TokenCost.of(64, 2, precision)  # 256 bytes vs 2 * 2 * 12 = 48
    in_bytes = Schedule(budget=256, buffer=64, precision=precision, budget_unit="bytes")
    resolved = in_bytes.in_tokens(cost)
    assert resolved.budget == 64 + 192 * 256 // 48 and resolved.budget_unit == "tokens"
    assert Schedule(budget=256, buffer=64, precision=precision).in_tokens(cost).budget == 256
    assert in_bytes.without_precision().precision is None


def test_event_moments_are_every_buffer_in_phase_with_the_budget() -> None:
    schedule = Schedule(budget=100, buffer=16)
    moments = [n for n in range(1, 200) if schedule.on_phase(n)]
    assert moments == [4, 20, 36, 52, 68, 84, 100, 116, 132, 148, 164, 180, 196]
    assert all(schedule.on_phase(n + schedule.tokens_until_phase(n)) for n in range(1, 200))
    assert all(
        not schedule.on_phase(n + t) for n in range(1, 200) for t in range(1, schedule.tokens_until_phase(n))
    )

"""A LayerKV's compaction: into its own buffers on the CPU when the caller gives it up, else into new ones;
both keep exactly the slots asked for, in order, with the policy's state, and a caller's tensors are
never written."""

from __future__ import annotations

import torch

from kvbench.core.layer_kv import LayerKV

BATCH, HEADS, SLOTS, DIM, KEEP, BUFFER = 3, 4, 40, 8, 24, 6


def owned_cache(seed: int = 0) -> LayerKV:
    g = torch.Generator().manual_seed(seed)
    layer = LayerKV.empty(BATCH, HEADS, DIM, dtype=torch.float32, device="cpu", capacity=SLOTS)
    keys, values = (
        torch.randn(BATCH, HEADS, SLOTS, DIM, generator=g),
        torch.randn(BATCH, HEADS, SLOTS, DIM, generator=g),
    )
    layer.append(keys, values, torch.arange(SLOTS).expand(BATCH, HEADS, SLOTS) + 100)
    layer.state.register_slot("acc", torch.rand(BATCH, HEADS, SLOTS, generator=g))
    return layer


def kept_index(seed: int) -> torch.Tensor:
    """Per row, KEEP - BUFFER candidates in slot order (row 0, head 0 keeps the first ones: nothing moves
    there), then the buffer's slots."""
    g = torch.Generator().manual_seed(seed)
    chosen = torch.rand(BATCH, HEADS, SLOTS - BUFFER, generator=g).topk(KEEP - BUFFER, dim=-1).indices
    chosen[0, 0] = torch.arange(KEEP - BUFFER)
    buffer = torch.arange(SLOTS - BUFFER, SLOTS).expand(BATCH, HEADS, BUFFER)
    return torch.cat([chosen.sort(-1).values, buffer], dim=-1)


def expected(layer: LayerKV, index: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the kept slots hold, gathered here by plain indexing."""
    b, h = torch.meshgrid(torch.arange(BATCH), torch.arange(HEADS), indexing="ij")
    b, h = b[..., None], h[..., None]
    return {
        "keys": layer.keys[b, h, index].clone(),
        "values": layer.values[b, h, index].clone(),
        "positions": layer.positions[b, h, index].clone(),
        "acc": layer.state.slot("acc")[b, h, index].clone(),
    }


def held(layer: LayerKV) -> dict[str, torch.Tensor]:
    return {
        "keys": layer.keys,
        "values": layer.values,
        "positions": layer.positions,
        "acc": layer.state.slot("acc"),
    }


def test_a_given_up_cache_compacts_into_its_own_buffers_and_keeps_what_was_asked() -> None:
    for seed in range(5):
        layer, index = owned_cache(seed), kept_index(seed)
        want, pointer = expected(layer, index), layer.keys.data_ptr()
        out = layer.compacted(index, BUFFER, reuse=True)
        assert out is layer and out.keys.data_ptr() == pointer and out.capacity == SLOTS  # no new buffer
        assert out.length == KEEP
        for name, tensor in held(out).items():
            assert torch.equal(tensor, want[name]), name
        # the next B tokens append in place, after the kept ones
        out.append(torch.ones(BATCH, HEADS, BUFFER, DIM), torch.ones(BATCH, HEADS, BUFFER, DIM),
                   torch.full((BATCH, HEADS, BUFFER), 999))  # fmt: skip
        assert out.keys.data_ptr() == pointer and torch.equal(out.keys[:, :, :KEEP], want["keys"])


def test_in_place_and_new_buffers_give_the_same_slots() -> None:
    index = kept_index(9)
    apart = owned_cache(9).compacted(index, BUFFER)
    together = owned_cache(9).compacted(index, BUFFER, reuse=True)
    for name, tensor in held(apart).items():
        assert torch.equal(tensor, held(together)[name]), name


def test_a_callers_tensors_and_a_kept_cache_are_never_written() -> None:
    source = owned_cache(3)
    keys, values, positions = source.keys.clone(), source.values.clone(), source.positions.clone()
    given = LayerKV(keys, values, positions)  # the caller's tensors, not the cache's own
    index = kept_index(3)
    out = given.compacted(index, BUFFER, reuse=True)
    assert out is not given
    assert torch.equal(keys, source.keys) and torch.equal(values, source.values)
    kept = owned_cache(4)
    before = kept.keys.clone()
    kept.compacted(kept_index(4), BUFFER)  # without reuse the cache stays as it was
    assert torch.equal(kept.keys, before)


def test_an_index_out_of_slot_order_is_compacted_into_new_buffers() -> None:
    layer, index = owned_cache(5), kept_index(5).flip(-1)  # the order a score-ordered protocol keeps
    want = expected(layer, index)
    out = layer.compacted(index, BUFFER, reuse=True)
    assert out is not layer
    for name, tensor in held(out).items():
        assert torch.equal(tensor, want[name]), name

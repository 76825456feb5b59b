"""Schedule invariants for every built-in policy, over many events and random shapes."""

from __future__ import annotations

import pytest
import torch
from synthetic_adapter import synthetic_model

from kvbench.core.schedule import Schedule
from kvbench.core.seeding import stable_seed
from kvbench.registry import known_policies, make_policy
from support import RecordingBackend, make_calibration

EVICTING = [name for name, cls in known_policies().items() if cls.evicts]

# (batch, layers, kv_heads, group, head_dim, budget, buffer, prompt_len, protection, order)
SHAPES = [
    (1, 1, 1, 1, 8, 24, 8, 5, "prompt", "chronological"),
    (3, 2, 2, 4, 16, 48, 16, 10, "prompt", "chronological"),
    (2, 2, 3, 3, 8, 40, 8, 60, "prompt", "chronological"),  # prompt longer than K − B − 1: capped
    (2, 1, 2, 2, 16, 36, 12, 7, "sinks", "chronological"),
    (2, 2, 2, 1, 8, 30, 6, 4, "none", "score"),
]


@pytest.mark.parametrize(
    "shape", SHAPES, ids=lambda s: f"B{s[0]}L{s[1]}H{s[2]}G{s[3]}K{s[5]}b{s[6]}{s[8]}-{s[9]}"
)
@pytest.mark.parametrize("name", EVICTING)
def test_schedule_invariants(name: str, shape: tuple) -> None:
    batch, layers, kv_heads, group, dim, budget, buffer, prompt_len, protection, order = shape
    model = synthetic_model(layers=layers, q_heads=kv_heads * group, kv_heads=kv_heads, head_dim=dim)
    schedule = Schedule(budget=budget, buffer=buffer, protection=protection, sinks=3, order=order)
    backend = RecordingBackend(
        make_policy(name, **({"window": 4} if "window" in make_policy(name).params() else {})),
        schedule,
        model,
        prompt_len=prompt_len,
        row_seeds=range(batch),
        calibration=make_calibration(model),
        seed=stable_seed(*map(str, shape)) % 1000,  # the same data in every process
    )
    protected = schedule.protected_prefix(prompt_len).count
    assert protected == min({"prompt": prompt_len, "sinks": 3, "none": 0}[protection], budget - buffer - 1)
    for kv in backend.layers:  # a tracer that must follow its token through every compaction
        kv.state.register_slot("tracer", kv.positions.double(), fill=-1.0)

    events = 0
    for _ in range(max(budget, prompt_len) + 5 * buffer + 3):
        record = backend.step()
        assert backend.layers[0].length <= budget + buffer or events == 0
        if not record.evicted:
            continue
        events += 1
        for layer, kv in enumerate(backend.layers):
            positions = kv.positions
            assert kv.keys.shape == (batch, kv_heads, budget, dim) and positions.shape == (
                batch,
                kv_heads,
                budget,
            )
            # the buffer: the B most recent tokens, last, in order
            recent = torch.arange(record.step - buffer, record.step)
            assert torch.equal(positions[..., -buffer:], recent.expand(batch, kv_heads, buffer))
            # no token twice in a head
            assert all(len(set(row.tolist())) == budget for row in positions.reshape(-1, budget))
            # protected slots are never evicted
            present = (positions.unsqueeze(-1) == torch.arange(protected)).any(dim=2)
            assert present.all()
            if order == "chronological":
                assert (positions.diff(dim=-1) > 0).all()
            # keys, values and state follow their tokens
            all_keys, all_values, _ = backend.token_history(layer)
            index = positions.unsqueeze(-1).expand(-1, -1, -1, dim)
            assert torch.equal(kv.keys, torch.gather(all_keys, 2, index))
            assert torch.equal(kv.values, torch.gather(all_values, 2, index))
            tracer = kv.state.slot("tracer")
            tracked = tracer >= 0
            assert torch.equal(tracer[tracked], positions[tracked].double())
            assert tracked[..., : min(protected, budget)].all() or protected == 0
    assert events == backend.evictor.stats.events >= 3


def test_cache_oscillates_between_k_and_k_plus_b() -> None:
    model = synthetic_model(layers=1)
    schedule = Schedule(budget=32, buffer=8)
    backend = RecordingBackend(make_policy("random"), schedule, model, prompt_len=4, row_seeds=[0])
    lengths, event_steps = [], []
    for _ in range(100):
        record = backend.step()
        lengths.append(backend.layers[0].length)
        if record.evicted:
            event_steps.append(record.step)
    # 4 prompt tokens + 36 steps reach K + B = 40: evict back to 32, then every B = 8 steps again
    assert event_steps == list(range(40, 105, 8))
    assert max(lengths) == 39 and min(lengths[36:]) == 32


def test_full_never_evicts() -> None:
    model = synthetic_model(layers=1)
    backend = RecordingBackend(
        make_policy("full"), Schedule(budget=16, buffer=4), model, prompt_len=3, row_seeds=[0]
    )
    for _ in range(50):
        assert not backend.step().evicted
    assert backend.layers[0].length == 53


def test_layer_reduce_mean_shares_one_keep_set_across_layers() -> None:
    model = synthetic_model(layers=3)
    backend = RecordingBackend(
        make_policy("triattention"),
        Schedule(budget=24, buffer=4),
        model,
        prompt_len=3,
        row_seeds=[0, 1],
        calibration=make_calibration(model),
    )
    for _ in range(60):
        backend.step()
    first = backend.layers[0].positions
    assert backend.evictor.stats.events > 3
    assert all(torch.equal(kv.positions, first) for kv in backend.layers)


def test_rows_leaving_the_batch_keep_their_draws() -> None:
    """Row 1 alone evicts exactly as row 1 inside a batch of three, once the others have left."""
    model = synthetic_model(layers=2)
    schedule = Schedule(budget=24, buffer=4)

    def run(row_seeds: list[int], drop_after: int | None) -> torch.Tensor:
        backend = RecordingBackend(
            make_policy("random"), schedule, model, prompt_len=3, row_seeds=row_seeds, seed=9
        )
        for step in range(80):
            if drop_after is not None and step == drop_after:
                backend.select_rows([1])
            backend.step()
        return backend.layers[1].positions[-1]

    # random's keep-sets depend only on its draws, and a row's draws only on (row seed, layer, event):
    # neither the other rows nor their leaving (after 6 events here) may change them.
    together = run([5, 7, 9], drop_after=50)
    alone = run([7], drop_after=None)
    assert torch.equal(together, alone)


def test_pinned_slots_are_kept_in_exactly_the_pinned_heads() -> None:
    """The planted-fact ablation: a needle protected in h of the KV heads, free to go in the others."""
    from kvbench.core.engine import PinnedSlots

    model = synthetic_model(layers=2, q_heads=8, kv_heads=4, head_dim=8)
    needle = torch.tensor([10, 11, 12])
    pinned = PinnedSlots(needle, torch.tensor([True, True, False, False]))
    backend = RecordingBackend(
        make_policy("streaming"),
        Schedule(budget=24, buffer=8),
        model,
        prompt_len=4,
        row_seeds=[0],
        pinned=pinned,
    )
    for _ in range(80):
        backend.step()
    for kv in backend.layers:
        has_needle = torch.isin(kv.positions[0], needle).sum(dim=-1)  # per KV head
        assert has_needle.tolist() == [3, 3, 0, 0]  # streaming evicts old tokens unless pinned


def test_layer_reduce_mean_keeps_the_top_k_of_the_mean_of_the_layers_scores() -> None:
    """Each layer scores differently; the shared keep-set must be the top K − B of their mean, which here
    is neither layer 0's nor any other single layer's top K − B."""
    from kvbench.core.contract import EvictionView, Policy, policy
    from kvbench.core.engine import Evictor
    from kvbench.core.layer_kv import LayerKV

    @policy("layer-dependent")
    class LayerDependent(Policy):
        """Scores that depend on the layer: the mean over layers differs from each layer's own."""

        layer_reduce = "mean"

        def score(self, view: EvictionView) -> torch.Tensor:
            return per_layer(view.positions, view.layer)

    def per_layer(positions: torch.Tensor, layer: int) -> torch.Tensor:
        # a fixed random score per (layer, position), a different table in every layer
        table = torch.randn(64, generator=torch.Generator().manual_seed(100 + layer))
        return table[positions]

    model = synthetic_model(layers=3, q_heads=2, kv_heads=1, head_dim=4)
    schedule = Schedule(budget=16, buffer=4, protection="none")
    gen = torch.Generator().manual_seed(0)
    length = 20
    positions = torch.arange(length).expand(1, 1, length).clone()
    layers = [
        LayerKV(
            torch.randn(1, 1, length, 4, generator=gen),
            torch.randn(1, 1, length, 4, generator=gen),
            positions,
        )
        for _ in range(3)
    ]
    evictor = Evictor(LayerDependent(), schedule, model, prompt_len=0, row_seeds=[0])
    kept = evictor.evict(layers, step=length)
    candidates = positions[..., : length - schedule.buffer]
    mean = torch.stack([per_layer(candidates, layer) for layer in range(3)]).mean(dim=0)
    expected = torch.topk(mean, schedule.keep, dim=-1).indices.sort(dim=-1).values[0, 0]
    buffer = torch.arange(length - schedule.buffer, length)
    for kv in kept:
        assert kv.positions[0, 0].tolist() == [*expected.tolist(), *buffer.tolist()]
    for layer in range(3):  # no single layer's choice would pass
        own = torch.topk(per_layer(candidates, layer), schedule.keep, dim=-1).indices.sort(dim=-1).values
        assert own[0, 0].tolist() != expected.tolist()


def test_per_row_policy_state_follows_its_row_when_others_leave() -> None:
    """curdkv draws its projection once per (layer, row): after rows 0 and 2 leave, the remaining row keeps
    row 1's projection, and its next evictions score with it (recomputed here from the cache)."""
    from kvbench.policies.scoring import leverage

    model = synthetic_model(layers=2)
    backend = RecordingBackend(
        make_policy("curdkv"), Schedule(budget=24, buffer=4), model, prompt_len=3, row_seeds=[5, 7, 9]
    )
    for _ in range(40):
        backend.step()
    assert backend.evictor.stats.events > 2
    before = [kv.state.row("projection")[1].clone() for kv in backend.layers]
    backend.select_rows([1])
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    policy = backend.evictor.policy
    original = type(policy).score

    def spy(self, view):
        scores = original(self, view)
        g = before[view.layer][None]
        joint = leverage(view.keys, g) * leverage(view.values, g)
        sinks = view.positions < 4  # curdkv keeps the first 4 slots
        seen.append((scores, (joint / joint.sum(dim=-1, keepdim=True)).masked_fill(sinks, float("inf"))))
        return scores

    type(policy).score = spy
    try:
        for _ in range(20):
            backend.step()
    finally:
        type(policy).score = original
    for kv, projection in zip(backend.layers, before, strict=True):
        assert kv.state.row("projection").shape[0] == 1
        assert torch.equal(kv.state.row("projection")[0], projection)
    assert seen and all(torch.allclose(got, want) for got, want in seen)

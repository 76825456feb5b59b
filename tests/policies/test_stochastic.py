"""Randomness: seeded, per row and event, and exactly the sampling each policy claims."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from scipy import stats
from synthetic_adapter import synthetic_model

from kvbench.core.contract import LayerState
from kvbench.core.engine import Evictor
from kvbench.core.layer_kv import LayerKV
from kvbench.core.schedule import Schedule
from kvbench.policies.scoring import gumbel_topk
from kvbench.registry import make_policy
from support import RecordingBackend, make_calibration, random_view

STOCHASTIC = ["random", "vase-attnv", "vase-dkv", "curdkv"]


def _run(name: str, row_seeds: list[int], steps: int = 90) -> torch.Tensor:
    model = synthetic_model(layers=2)
    backend = RecordingBackend(
        make_policy(name),
        Schedule(budget=32, buffer=8),
        model,
        prompt_len=5,
        row_seeds=row_seeds,
        seed=1,
        calibration=make_calibration(model),
    )
    for _ in range(steps):
        backend.step()
    return torch.stack([kv.positions for kv in backend.layers])


@pytest.mark.parametrize("name", STOCHASTIC)
def test_same_seed_same_keep_set_other_seed_other_keep_set(name: str) -> None:
    assert torch.equal(_run(name, [3, 4]), _run(name, [3, 4]))
    assert not torch.equal(_run(name, [3, 4]), _run(name, [5, 6]))


@pytest.mark.parametrize("name", ["random", "vase-attnv", "vase-dkv"])
def test_different_events_draw_differently(name: str) -> None:
    policy = make_policy(name)
    view = random_view(policy, event=3)
    later = random_view(policy, event=4)  # same tensors (same seed), another event
    assert torch.equal(view.keys, later.keys)
    assert not torch.equal(policy.score(view), policy.score(later))


def test_random_keeps_each_unprotected_slot_with_probability_m_over_n() -> None:
    rows, heads, n, buffer, protected, keep = 4000, 2, 20, 4, 4, 10
    model = synthetic_model(layers=1, q_heads=2, kv_heads=heads, head_dim=4)
    positions = torch.arange(n + buffer).expand(rows, heads, -1).contiguous()
    layer = LayerKV(
        torch.zeros(rows, heads, n + buffer, 4), torch.zeros(rows, heads, n + buffer, 4), positions
    )
    evictor = Evictor(
        make_policy("random"),
        Schedule(budget=keep + buffer, buffer=buffer),
        model,
        prompt_len=protected,
        row_seeds=range(rows),
    )
    (kept,) = evictor.evict([layer], step=n + buffer)
    counts = torch.zeros(n)
    for slot in range(n):
        counts[slot] = (kept.positions == slot).sum()
    assert (counts[:protected] == rows * heads).all()
    p = (keep - protected) / (n - protected)
    trials = rows * heads
    pvalues = [stats.binomtest(int(c), trials, p).pvalue for c in counts[protected:]]
    assert min(pvalues) > 0.001 / len(pvalues), (counts, p)  # Bonferroni over the slots
    # and the test has power: a slot favoured by 3 points would be caught
    assert stats.binomtest(int(trials * (p + 0.03)), trials, p).pvalue < 0.001 / len(pvalues)


def _exact_pair_probabilities(w: list[float]) -> dict[tuple[int, int], float]:
    """P({i, j}) when drawing 2 without replacement with probability proportional to w."""
    total = sum(w)
    p = [x / total for x in w]
    return {
        (i, j): p[i] * p[j] / (1 - p[i]) + p[j] * p[i] / (1 - p[j])
        for i, j in itertools.combinations(range(len(w)), 2)
    }


def test_gumbel_topk_is_weighted_sampling_without_replacement() -> None:
    weights = [0.4, 0.3, 0.15, 0.1, 0.05]
    draws = 40_000
    view = random_view(make_policy("random"), batch=1)
    view = dataclasses.replace(view, keys=torch.zeros(1, draws, 5, 1))
    scores = gumbel_topk(torch.tensor(weights).expand(1, draws, 5), view)
    chosen = scores.topk(2, dim=-1).indices.sort(dim=-1).values[0]
    exact = _exact_pair_probabilities(weights)
    pairs = list(exact)
    observed = [int(((chosen[:, 0] == i) & (chosen[:, 1] == j)).sum()) for i, j in pairs]
    expected = [exact[pair] * draws for pair in pairs]
    assert math.isclose(sum(expected), draws)
    assert stats.chisquare(observed, expected).pvalue > 0.001


def test_gumbel_topk_never_draws_zero_weights_before_positive_ones() -> None:
    weights = torch.tensor([0.0, 1e-30, 0.0, 5.0, 0.0, 1e-38, 0.0])
    view = random_view(make_policy("random"), batch=1)
    view = dataclasses.replace(view, keys=torch.zeros(1, 5000, 7, 1))
    scores = gumbel_topk(weights.expand(1, 5000, 7), view)
    assert scores.isfinite().all()
    chosen = scores.topk(3, dim=-1).indices[0]
    assert (chosen.sort(-1).values == torch.tensor([1, 3, 5])).all()
    # the zero weights, drawn after them, are uniform among themselves
    fourth = scores.topk(4, dim=-1).indices[0, :, 3]
    counts = [int((fourth == i).sum()) for i in (0, 2, 4, 6)]
    assert stats.chisquare(counts).pvalue > 0.001


def test_vase_attnv_always_keeps_the_largest_value_ranges() -> None:
    policy = make_policy("vase-attnv", window=8)
    for trial in range(5):
        view = random_view(policy, n=72, budget=64, buffer=8, seed=trial, prompt_len=2)
        gen = torch.Generator().manual_seed(trial)
        layer = LayerKV(
            torch.cat(
                [view.keys, torch.randn(*view.keys.shape[:2], 8, view.keys.shape[-1], generator=gen)], 2
            ),
            torch.cat(
                [view.values, torch.randn(*view.values.shape[:2], 8, view.values.shape[-1], generator=gen)], 2
            ),
            torch.cat([view.positions, view.positions.amax(-1, keepdim=True) + torch.arange(1, 9)], 2),
        )
        evictor = Evictor(policy, Schedule(budget=64, buffer=8), view.model, prompt_len=2, row_seeds=[1, 2])
        (kept,) = evictor.evict([layer], step=view.step, queries=[view.queries])
        value_range = view.values.amax(-1) - view.values.amin(-1)
        top = value_range.masked_fill(view.protected, float("-inf")).topk(16, dim=-1).indices
        must_keep = torch.gather(view.positions, 2, top)
        assert (must_keep.unsqueeze(-1) == kept.positions.unsqueeze(-2)).any(-1).all()


@pytest.mark.parametrize(("recent", "survives"), [(0.5, True), (0.0, False)])
def test_h2o_a_token_younger_than_its_window_survives_its_first_event(recent: float, survives: bool) -> None:
    # K = 64, B = 8: 64 candidates, 56 kept. The 40 oldest have accumulated much attention, the 24
    # youngest little (the youngest least): by attention alone the youngest candidate goes first.
    policy = make_policy("h2o", recent=recent)
    model = synthetic_model(layers=1, q_heads=4, kv_heads=2, head_dim=16)
    gen = torch.Generator().manual_seed(0)
    positions = torch.arange(72).expand(1, 2, 72)
    layer = LayerKV(
        torch.randn(1, 2, 72, 16, generator=gen), torch.randn(1, 2, 72, 16, generator=gen), positions
    )
    acc = torch.where(positions < 40, 100.0 + positions, 1.0 / (1.0 + positions)).float()
    layer.state.register_slot("acc", acc)
    evictor = Evictor(policy, Schedule(budget=64, buffer=8), model, prompt_len=2, row_seeds=[0])
    (kept,) = evictor.evict([layer], step=72, queries=[None])
    held = set(kept.positions[0, 0].tolist())
    assert (63 in held) == survives
    if survives:  # the window is the newest 32 slots, buffer included; heavy hitters fill the rest
        assert set(range(40, 72)) <= held and len(held & set(range(40))) == 64 - 32
    else:  # the 56 candidates with the most attention: the 40 old ones and the 16 oldest young ones
        assert held == set(range(56)) | set(range(64, 72))


@pytest.mark.parametrize("name", ["curdkv", "vase-dkv"])
@pytest.mark.parametrize("sinks", [4, 0])
def test_leverage_policies_keep_four_sinks_without_protection(name: str, sinks: int) -> None:
    # the first 4 tokens have zero values, so zero leverage: only the policy's sinks keep them
    policy = make_policy(name, sinks=sinks)
    model = synthetic_model(layers=1, q_heads=4, kv_heads=2, head_dim=16)
    keys, values = torch.randn(2, 2, 2, 72, 16, generator=torch.Generator().manual_seed(1))
    values[:, :, :4] = 0.0
    layer = LayerKV(keys, values, torch.arange(72).expand(2, 2, 72))
    schedule = Schedule(budget=64, buffer=8, protection="none")
    evictor = Evictor(policy, schedule, model, prompt_len=10, row_seeds=[0, 1])
    (kept,) = evictor.evict([layer], step=72, queries=[None])
    first = (kept.positions < 4).sum(dim=-1)
    assert first.tolist() == ([[4, 4], [4, 4]] if sinks else [[0, 0], [0, 0]])


def test_curdkv_keeps_its_projection_and_vase_dkv_redraws() -> None:
    curdkv, vase = make_policy("curdkv"), make_policy("vase-dkv")
    state = LayerState()
    first = curdkv.score(random_view(curdkv, event=0, state=state))
    g = state.row("projection").clone()
    again = curdkv.score(random_view(curdkv, event=7, state=state))
    assert torch.equal(state.row("projection"), g) and torch.equal(first, again)
    assert not torch.equal(vase.score(random_view(vase, event=0)), vase.score(random_view(vase, event=7)))


def test_h2o_accumulator_is_the_summed_softmax_probabilities() -> None:
    model = synthetic_model(layers=2, q_heads=6, kv_heads=2, head_dim=8)
    backend = RecordingBackend(
        make_policy("h2o"), Schedule(budget=512, buffer=8), model, prompt_len=7, row_seeds=[0, 1]
    )
    for _ in range(20):
        backend.step()
    for layer, kv in enumerate(backend.layers):
        keys, _, queries = backend.token_history(layer)
        seen = keys.shape[2]
        expected = torch.zeros(2, 2, seen)
        for b in range(2):
            for h in range(2):
                for t in range(seen):  # the query of token t attends to tokens 0..t
                    probs = [
                        (queries[b, h * 3 + j, t] @ keys[b, h, : t + 1].T / math.sqrt(8)).softmax(-1)
                        for j in range(3)
                    ]
                    expected[b, h, : t + 1] += torch.stack(probs).mean(0)
        assert torch.allclose(kv.state.slot("acc"), expected, atol=1e-5)

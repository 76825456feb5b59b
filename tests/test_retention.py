"""Retention telemetry computed by hand from kept sets that are known: streaming keeps a suffix in every
head, a striding scorer keeps different positions per head, and the engine's figures must match sets
counted in plain Python from the compacted cache."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from kvbench.core.contract import EvictionView, Policy, policy
from kvbench.core.retention import AGE_BUCKETS
from kvbench.core.schedule import Schedule
from kvbench.registry import make_policy
from tests.synthetic_adapter import SyntheticBackend, synthetic_model


@policy("test-stride")
class Stride(Policy):
    """Head h prefers positions p with p % Hkv == h (newest first): heads keep different tokens."""

    def score(self, view: EvictionView) -> Tensor:
        heads = view.positions.shape[1]
        head = torch.arange(heads).view(1, -1, 1)
        return ((view.positions % heads) == head).float() + view.positions.float() / 1e6


def _run(scorer: Policy, protection: str, *, steps: int, prompt: int = 20, budget: int = 24, buffer: int = 4):
    schedule = Schedule(budget=budget, buffer=buffer, protection=protection)  # type: ignore[arg-type]
    model = synthetic_model(layers=2, q_heads=6, kv_heads=3)
    backend = SyntheticBackend(scorer, schedule, model, prompt_len=prompt, row_seeds=[0, 1])
    last_event = 0
    for _ in range(steps):
        if backend.step().evicted:
            last_event = backend.seen
    return backend, last_event


def _by_hand(backend: SyntheticBackend, step: int, prompt: int, row: int) -> dict[str, list[float]]:
    """The four figures from the compacted cache's kept sets (its first K − B slots per head; no token
    came after the last event, so the rest is the buffer)."""
    schedule = backend.schedule
    keep, buffer = schedule.keep, schedule.buffer
    span = step - buffer
    figures: dict[str, list[float]] = {"any": [], "all": [], "coverage": [], "age": []}
    age_kept = [[0.0] * AGE_BUCKETS for _ in backend.layers]
    for layer, kv in enumerate(backend.layers):
        heads = [set(kv.positions[row, h, :keep].tolist()) for h in range(kv.positions.shape[1])]
        held = [h | set(range(span, step)) for h in heads]
        prompt_set = set(range(prompt))
        figures["any"].append(len(set.union(*held) & prompt_set) / prompt)
        figures["all"].append(len(set.intersection(*held) & prompt_set) / prompt)
        figures["coverage"].append(len(set.union(*heads)) / (len(heads) * keep))
        for bucket in range(AGE_BUCKETS):
            members = {p for p in range(span) if p * AGE_BUCKETS // span == bucket}
            age_kept[layer][bucket] = sum(len(h & members) for h in heads) / (len(heads) * len(members))
    figures["age"] = [sum(column) / len(column) for column in zip(*age_kept, strict=True)]
    return figures


def _engine(backend: SyntheticBackend, row: int) -> dict[str, list[float]]:
    assert backend.evictor.retention is not None
    found = backend.evictor.retention.row(row)
    assert found is not None
    fields = (found.prompt_held_any, found.prompt_held_all, found.head_coverage, found.kept_by_age)
    return dict(zip(("any", "all", "coverage", "age"), fields, strict=True))


def _same(engine: dict[str, list[float]], hand: dict[str, list[float]]) -> None:
    assert engine.keys() == hand.keys()
    for name in engine:
        assert engine[name] == pytest.approx(hand[name]), name


def test_streaming_keeps_one_suffix_coverage_is_one_over_heads_and_age_is_a_step() -> None:
    backend, step = _run(make_policy("streaming"), "none", steps=57)
    keep, buffer = backend.schedule.keep, backend.schedule.buffer
    assert step == 76  # events at 28, 32, ..., 76 tokens: the prompt's 20, then every B = 4 past K = 24
    for row in (0, 1):
        engine = _engine(backend, row)
        _same(engine, _by_hand(backend, step, 20, row))
        assert engine["coverage"] == pytest.approx([1 / 3, 1 / 3])
        span = step - buffer
        # the suffix [span − keep, span) kept by every head: whole buckets after it, none before it
        expected = []
        for bucket in range(AGE_BUCKETS):
            members = [p for p in range(span) if p * AGE_BUCKETS // span == bucket]
            expected.append(sum(p >= span - keep for p in members) / len(members))
        assert engine["age"] == pytest.approx(expected)
        assert expected[-1] == 1.0 and expected[0] == 0.0  # a step from nothing kept to everything kept
        assert engine["any"] == engine["all"] == pytest.approx([0.0, 0.0])  # the prompt is long gone


def test_striding_heads_keep_different_positions_and_the_figures_match_the_sets() -> None:
    backend, step = _run(Stride(), "none", steps=33)
    for row in (0, 1):
        engine, hand = _engine(backend, row), _by_hand(backend, step, 20, row)
        _same(engine, hand)
        assert all(c > 1 / 3 + 0.2 for c in engine["coverage"])  # heads diversified
        assert engine["any"][0] > 0 and engine["all"][0] < engine["any"][0]


def test_a_protected_prompt_survives_in_every_head() -> None:
    backend, step = _run(make_policy("random"), "prompt", steps=30, budget=32)  # K − B − 1 ≥ the prompt's 20
    for row in (0, 1):
        engine = _engine(backend, row)
        _same(engine, _by_hand(backend, step, 20, row))
        assert engine["any"] == engine["all"] == pytest.approx([1.0, 1.0])


def test_a_row_leaving_the_batch_keeps_its_summary_and_the_others_theirs() -> None:
    backend, _ = _run(make_policy("random"), "none", steps=33)
    log = backend.evictor.retention
    assert log is not None
    second = log.row(1)
    backend.evictor.select_rows([1])
    assert log.row(0) == second


def test_the_needle_distance_counts_the_events_a_position_lived_through() -> None:
    backend, _ = _run(make_policy("random"), "none", steps=60)
    log = backend.evictor.retention
    assert log is not None
    assert log.steps == [s for s in range(21, 81) if s > 24 and (s - 24) % 4 == 0]
    # position 30 leaves the buffer once 30 < step − 4; the token at 60 attends after events up to 60
    assert log.events_between(30, 60) == len([s for s in log.steps if 34 < s <= 60])
    assert log.events_between(30, 60) == 7  # at 36, 40, ..., 60


def test_no_event_no_summary() -> None:
    backend, _ = _run(make_policy("random"), "none", steps=3)
    assert backend.evictor.retention is not None and backend.evictor.retention.row(0) is None


def test_prompt_tokens_still_in_the_buffer_are_held_by_every_head() -> None:
    backend, step = _run(Stride(), "none", steps=2, prompt=22, budget=12)
    assert step == 24  # the first event: positions 20 and 21 of the prompt are in the buffer [20, 24)
    for row in (0, 1):
        engine, hand = _engine(backend, row), _by_hand(backend, step, 22, row)
        _same(engine, hand)
        assert engine["all"][0] >= 2 / 22 - 1e-6  # the buffer's two prompt tokens at least

"""Bad scorers and bad budgets fail early, with messages that name the policy, layer and event."""

from __future__ import annotations

import re

import pytest
import torch
from synthetic_adapter import SyntheticBackend, synthetic_model

from kvbench.core.contract import EvictionView, Policy, policy
from kvbench.core.engine import Evictor
from kvbench.core.layer_kv import LayerKV
from kvbench.core.schedule import Schedule
from kvbench.errors import BudgetError, CapabilityError, PolicyOutputError, ScorerError
from kvbench.registry import make_policy


def _scorer(name: str, make):
    @policy(name)
    class Broken(Policy):
        """A deliberately broken scorer."""

        def score(self, view: EvictionView):
            return make(view)

    return Broken()


def _ones(view: EvictionView) -> torch.Tensor:
    return torch.ones(view.positions.shape)


BROKEN = {
    "nan": (lambda v: _ones(v).index_fill(2, torch.tensor([3]), float("nan")), "NaN scores"),
    "shape": (lambda v: _ones(v)[:, :, 1:], r"shape \(2, 2, \d+\); expected \[B, Hkv, n\] = \(2, 2, \d+\)"),
    "int": (lambda v: _ones(v).long(), "torch.int64 scores; return float32"),
    "bf16": (lambda v: _ones(v).bfloat16(), "torch.bfloat16 scores"),
    "device": (lambda v: _ones(v).to("meta"), "scores on meta"),
    "list": (lambda v: _ones(v).tolist(), "returned list"),
    "too-few": (
        lambda v: _ones(v).index_fill(2, torch.arange(6, v.num_candidates), float("-inf")),
        "candidates with a score above -inf",
    ),
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_broken_scorer_is_named_with_layer_and_event(kind: str) -> None:
    make, message = BROKEN[kind]
    backend = SyntheticBackend(
        _scorer(f"broken-{kind}", make),
        Schedule(budget=32, buffer=8),
        synthetic_model(layers=2),
        prompt_len=4,
        row_seeds=[0, 1],
    )
    with pytest.raises(PolicyOutputError) as caught:
        for _ in range(60):
            backend.step()
    text = str(caught.value)
    assert f"policy 'broken-{kind}' at layer 0, eviction event 0" in text
    assert re.search(message, text), text


def test_the_error_names_the_event_where_it_happened() -> None:
    seen = []

    def later(view: EvictionView) -> torch.Tensor:
        seen.append(view.event)
        return _ones(view) * (float("nan") if view.event == 2 and view.layer == 1 else 1.0)

    backend = SyntheticBackend(
        _scorer("late", later),
        Schedule(budget=32, buffer=8),
        synthetic_model(layers=2),
        prompt_len=4,
        row_seeds=[0],
    )
    with pytest.raises(PolicyOutputError, match="policy 'late' at layer 1, eviction event 2"):
        for _ in range(80):
            backend.step()


@pytest.mark.parametrize(
    ("raised", "named"),
    [
        (ValueError("bad value"), "ValueError: bad value"),
        (MemoryError("out of memory"), "MemoryError: out of memory"),
        (SystemExit(0), "SystemExit: 0"),  # exited 0, silently, from inside a run
    ],
)
def test_what_a_scorer_raises_is_named_with_its_layer_and_event(raised: BaseException, named: str) -> None:
    def fails(view: EvictionView) -> torch.Tensor:
        if view.layer == 1:
            raise raised
        return _ones(view)

    backend = SyntheticBackend(
        _scorer("raises", fails),
        Schedule(budget=32, buffer=8),
        synthetic_model(layers=2),
        prompt_len=4,
        row_seeds=[0],
    )
    with pytest.raises(
        ScorerError, match=re.escape(f"policy 'raises' at layer 1, eviction event 0 raised {named}")
    ):
        for _ in range(60):
            backend.step()


def test_a_scorers_keyboard_interrupt_stays_one_and_says_where() -> None:
    def interrupts(view: EvictionView) -> torch.Tensor:
        raise KeyboardInterrupt

    backend = SyntheticBackend(
        _scorer("ctrl-c", interrupts),
        Schedule(budget=32, buffer=8),
        synthetic_model(),
        prompt_len=4,
        row_seeds=[0],
    )
    with pytest.raises(KeyboardInterrupt) as caught:
        for _ in range(60):
            backend.step()
    assert caught.value.__notes__ == ["in policy 'ctrl-c' at layer 0, eviction event 0"]


@pytest.mark.parametrize("inference", [False, True], ids=["tensors", "inference-tensors"])
@pytest.mark.parametrize("edit", ["keys", "values", "positions"])
def test_a_scorer_that_edits_the_cache_in_place_is_refused(edit: str, inference: bool) -> None:
    def edits(view: EvictionView) -> torch.Tensor:
        getattr(view, edit).mul_(0)
        return _ones(view)

    backend = SyntheticBackend(
        _scorer("editor", edits),
        Schedule(budget=32, buffer=8),
        synthetic_model(),
        prompt_len=4,
        row_seeds=[0],
    )
    with torch.inference_mode(inference), pytest.raises(PolicyOutputError) as caught:
        for _ in range(60):
            backend.step()
    assert "policy 'editor' at layer 0, eviction event 0 changed a tensor it was given in place" in str(
        caught.value
    )
    assert all(kv.keys.abs().sum() > 0 for kv in backend.layers)  # the cache was not zeroed


def test_float64_scores_are_ranked_in_float64() -> None:
    """Scores apart only past float32's resolution: ranked in float32 they all tie, and the keep-set is
    whatever top-k makes of ties; ranked as given, the newest candidates are kept."""

    def newest_by_a_hair(view: EvictionView) -> torch.Tensor:
        return 1.0 + view.positions.double() * 1e-12

    evictor = Evictor(
        _scorer("hair", newest_by_a_hair),
        Schedule(budget=16, buffer=4, protection="none"),
        synthetic_model(layers=1, kv_heads=1),
        prompt_len=0,
        row_seeds=[0],
    )
    length = 20
    positions = torch.arange(length).view(1, 1, length)
    layer = LayerKV(torch.randn(1, 1, length, 16), torch.randn(1, 1, length, 16), positions.clone())
    (kept,) = evictor.evict([layer], step=length)
    assert kept.positions[0, 0].tolist() == list(range(4, 20))  # the newest K − B = 12, then the buffer


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget": 64, "buffer": 64}, "must be larger than the buffer"),
        ({"budget": 16, "buffer": 64}, "K=16 must be larger than the buffer B=64"),
        (
            {"budget": 100, "buffer": 64, "budget_multiple_of_buffer": True},
            "not a multiple of the buffer B=64.*use 128$",  # not 64: K must be larger than B
        ),
        (
            {"budget": 200, "buffer": 64, "budget_multiple_of_buffer": True},
            "not a multiple of the buffer B=64.*use 192 or 256$",
        ),
        ({"budget": 100, "buffer": 0}, "buffer must be at least 1"),
        ({"budget": 100, "buffer": 8, "protection": "everything"}, "protection must be"),
        ({"budget": 100, "buffer": 8, "order": "x"}, "^order must be 'chronological' or 'score', got 'x'$"),
        (
            {"budget": 100, "buffer": 8, "protection": "all"},
            "^protection must be 'prompt', 'sinks' or 'none', got 'all'$",
        ),
    ],
)
def test_bad_budgets_are_refused_with_the_reason(kwargs: dict, message: str) -> None:
    with pytest.raises(BudgetError, match=message):
        Schedule(**kwargs)


def test_multiple_of_buffer_accepted_when_required() -> None:
    assert Schedule(budget=128, buffer=64, budget_multiple_of_buffer=True).keep == 64


def test_long_prompt_protection_is_capped_and_reported() -> None:
    schedule = Schedule(budget=128, buffer=32)
    prefix = schedule.protected_prefix(500)
    assert (prefix.requested, prefix.count, prefix.capped) == (500, 95, True)
    assert not schedule.protected_prefix(95).capped


def test_only_a_capped_prompt_is_refused_not_capped_sinks() -> None:
    # refuse_capped is about "protecting the whole prompt": four sinks capped at K − B − 1 = 3 are reported
    # (protected_prefix), and a run that refuses capped prompts has no prompt protection to refuse.
    sinks = Schedule(budget=8, buffer=4, protection="sinks", sinks=4)
    assert sinks.protected_prefix(100).capped
    sinks.refuse_capped(100)
    with pytest.raises(BudgetError, match="protect 3 prompt tokens, but the prompt has 100"):
        Schedule(budget=8, buffer=4).refuse_capped(100)


def test_missing_queries_are_refused() -> None:
    model = synthetic_model(layers=1)
    evictor = Evictor(
        make_policy("snapkv"), Schedule(budget=16, buffer=4), model, prompt_len=2, row_seeds=[0]
    )
    layer = LayerKV(torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16), torch.arange(20).expand(1, 2, 20))
    with pytest.raises(CapabilityError, match="'snapkv' needs recent queries"):
        evictor.evict([layer], step=20)


def test_missing_calibration_is_refused_before_any_work() -> None:
    with pytest.raises(CapabilityError, match="kvbench calibrate --model"):
        Evictor(
            make_policy("triattention"),
            Schedule(budget=16, buffer=4),
            synthetic_model(),
            prompt_len=2,
            row_seeds=[0],
        )


def test_policy_own_infinity_never_displaces_protected_slots() -> None:
    @policy("all-inf")
    class Greedy(Policy):
        """Claims every slot."""

        def score(self, view: EvictionView) -> torch.Tensor:
            return torch.full(view.positions.shape, float("inf"))

    model = synthetic_model(layers=1)
    backend = SyntheticBackend(Greedy(), Schedule(budget=24, buffer=4), model, prompt_len=19, row_seeds=[0])
    for _ in range(30):
        backend.step()
    assert (backend.layers[0].positions[..., :19] == torch.arange(19)).all()


def test_an_unknown_name_lists_the_known_ones_in_plain_english() -> None:
    from kvbench.errors import UnknownNameError

    assert str(UnknownNameError("policy", "snapk", ["snapkv", "random"])) == (
        "unknown policy 'snapk'. Did you mean 'snapkv'? Known policies: random, snapkv."
    )
    assert str(UnknownNameError("suite", "fast", [])).endswith("Known suites: (none).")


@pytest.mark.parametrize("doc", [None, "", "   \n  "])
def test_a_policy_without_a_docstring_is_described_by_its_name(doc: str | None) -> None:
    # "The class docstring's first line is the policy's one-line description": with no line, its name.
    undocumented = type("Undocumented", (Policy,), {"__doc__": doc, "__annotations__": {}})
    assert policy("undocumented")(undocumented).description == "undocumented"


def test_a_policy_is_described_by_its_docstrings_first_line() -> None:
    documented = type(
        "Documented", (Policy,), {"__doc__": "\n   Keeps the keys.\n\n   More.", "__annotations__": {}}
    )
    assert policy("documented")(documented).description == "Keeps the keys."

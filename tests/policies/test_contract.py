"""One contract, checked for every registered policy: shape, finite values, determinism, read-only view."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvbench.core.contract import LayerState, Policy
from kvbench.registry import known_policies, make_policy
from support import random_view

SCORERS = [name for name, cls in known_policies().items() if cls.evicts]


def _view(policy: Policy, state: LayerState | None = None):
    view = random_view(policy, state=state)
    if "step_attention" in policy.needs:  # a scorer that observes needs to have observed something
        gen = torch.Generator().manual_seed(0)
        view.state.register_slot(
            "acc", torch.rand(*view.positions.shape[:2], view.num_candidates + 8, generator=gen)
        )
    return view


@pytest.mark.parametrize("name", SCORERS)
def test_scores_have_the_contract_shape_dtype_and_values(name: str) -> None:
    policy = make_policy(name)
    view = _view(policy)
    scores = policy.score(view)
    assert scores.shape == view.positions.shape
    assert scores.dtype == torch.float32 and scores.device == view.keys.device
    assert not scores.isnan().any()
    assert (scores > float("-inf")).sum(-1).min() >= view.keep


@pytest.mark.parametrize("name", SCORERS)
def test_same_rng_same_scores(name: str) -> None:
    policy = make_policy(name)
    first, second = policy.score(_view(policy)), policy.score(_view(policy))
    assert torch.equal(first, second)


@pytest.mark.parametrize("name", SCORERS)
def test_view_is_left_unchanged(name: str) -> None:
    policy = make_policy(name)
    view = _view(policy)
    tensors = {
        f.name: getattr(view, f.name).clone()
        for f in dataclasses.fields(view)
        if isinstance(getattr(view, f.name), torch.Tensor)
    }
    policy.score(view)
    for field_name, before in tensors.items():
        assert torch.equal(getattr(view, field_name), before), field_name


@pytest.mark.parametrize("name", list(known_policies()))
def test_policy_is_documented_and_parameters_are_recorded(name: str) -> None:
    cls = known_policies()[name]
    module = __import__(cls.__module__, fromlist=["_"])
    assert module.__doc__ and len(module.__doc__.strip()) > 40, "module docstring names the source"
    assert cls.description and cls.description != name
    policy = make_policy(name)
    assert all(isinstance(k, str) for k in policy.params())
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.some_field = 1  # type: ignore[attr-defined]

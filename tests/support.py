"""Builders shared by the tests: random eviction views and a synthetic backend that remembers history."""

from __future__ import annotations

import os

import pytest
import torch
from synthetic_adapter import SyntheticBackend, synthetic_model
from torch import Tensor

from kvbench.core.calibration import QueryStats
from kvbench.core.contract import EvictionView, LayerState, ModelFacts, Policy
from kvbench.core.rope import apply_rope
from kvbench.core.seeding import eviction_seed, generator

ROW_SEEDS = (11, 22, 33, 44)


def make_calibration(model: ModelFacts, seed: int = 5) -> QueryStats:
    gen = torch.Generator().manual_seed(seed)
    queries = [
        torch.randn(model.num_q_heads, 64, model.head_dim, generator=gen) + 0.5
        for _ in range(model.num_layers)
    ]
    return QueryStats.from_queries(model.name, "random test corpus", queries)


def random_view(
    policy: Policy,
    *,
    batch: int = 2,
    kv_heads: int = 2,
    group: int = 2,
    dim: int = 16,
    n: int = 40,
    window: int = 16,
    prompt_len: int = 6,
    protected_count: int | None = None,
    budget: int = 32,
    buffer: int = 8,
    layer: int = 1,
    event: int = 3,
    seed: int = 0,
    state: LayerState | None = None,
) -> EvictionView:
    """A view on n candidates whose positions are an increasing random subset of [0, step) per head."""
    model = synthetic_model(layers=2, q_heads=kv_heads * group, kv_heads=kv_heads, head_dim=dim)
    gen = torch.Generator().manual_seed(seed)
    step = n + 3 * buffer + prompt_len
    positions = torch.stack(
        [
            torch.stack(
                [torch.randperm(step - buffer, generator=gen)[:n].sort().values for _ in range(kv_heads)]
            )
            for _ in range(batch)
        ]
    )
    positions[..., :prompt_len] = torch.arange(prompt_len)  # the prompt is protected, so it is always there
    positions = positions.sort(dim=-1).values
    keys = apply_rope(torch.randn(batch, kv_heads, n, dim, generator=gen), positions, model.rope_inv_freq)
    values = (
        torch.randn(batch, kv_heads, n, dim, generator=gen)
        * torch.rand(batch, kv_heads, n, 1, generator=gen)
        * 3
    )
    q_pos = torch.arange(step - window, step).expand(batch, model.num_q_heads, window)
    queries = apply_rope(
        torch.randn(batch, model.num_q_heads, window, dim, generator=gen), q_pos, model.rope_inv_freq
    )
    count = prompt_len if protected_count is None else protected_count
    seeds = ROW_SEEDS[:batch]
    return EvictionView(
        keys=keys,
        values=values,
        positions=positions,
        protected=positions < count,
        layer=layer,
        event=event,
        step=step,
        prompt_len=prompt_len,
        budget=budget,
        keep=budget - buffer,
        model=model,
        state=state if state is not None else LayerState(),
        rngs=tuple(generator(eviction_seed(s, layer, event)) for s in seeds),
        recent_queries=queries if "queries" in policy.needs else None,
        calibration=make_calibration(model) if "calibration" in policy.needs else None,
    )


def row_generators(view: EvictionView) -> list[torch.Generator]:
    """Fresh generators equal to the view's, for recomputing its draws independently."""
    return [generator(eviction_seed(s, view.layer, view.event)) for s in ROW_SEEDS[: view.keys.shape[0]]]


class RecordingBackend(SyntheticBackend):
    """The synthetic backend, remembering every key and value it ever produced, by layer and position."""

    def __init__(self, *args, **kwargs) -> None:
        self.history: list[tuple[Tensor, Tensor, Tensor]] = []  # (keys, values, queries) per call
        super().__init__(*args, **kwargs)

    def _new_tokens(self, count: int):
        keys, values, positions, queries = super()._new_tokens(count)
        self.history.append((keys, values, queries))
        return keys, values, positions, queries

    def token_history(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        """All keys, values [B, Hkv, seen, D] and queries [B, Hq, seen, D] of ``layer``, in position order."""
        calls = self.history[layer :: self.model.num_layers]
        return tuple(torch.cat([call[i] for call in calls], dim=2) for i in range(3))


def holm_by_definition(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment written from its definition, to check the library's against."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, (len(p_values) - rank) * p_values[i])
        adjusted[i] = min(1.0, running)
    return adjusted


def _sandbox_usable() -> bool:
    from kvbench.graders.sandbox import Sandbox, SandboxUnavailableError

    try:
        Sandbox().check()
    except SandboxUnavailableError:
        return False
    return True


def sandbox_expected() -> bool:
    """Whether tests must find bubblewrap working: it works here, or CI demands it."""
    return bool(os.environ.get("KVBENCH_REQUIRE_SANDBOX")) or _sandbox_usable()


needs_sandbox = pytest.mark.skipif(
    not sandbox_expected(),
    reason="bubblewrap is not usable here: apt-get install bubblewrap (CI sets KVBENCH_REQUIRE_SANDBOX=1)",
)
"""Tests of the bubblewrap boundary (code grading, isolated scorers): skipped only where bwrap cannot
run and CI did not ask for it."""

"""Device parity of the eviction path: the positions every policy keeps at every event, on two devices.

A seeded tiny model (the same weights on both devices, built on the CPU) is teacher-forced through the
same token sequence under each policy, so the model's outputs never steer the comparison; after every
forward the cache's kept positions are read whenever an event fired. A policy that draws (its scoring
advances the view's generators) cannot match across devices, since torch's generators are per device:
for those the check is that draws follow the seed (the same seeds keep the same positions, other seeds
others, and a row keeps the same positions whatever rows share its batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from kvbench.adapters.hf.cache import EvictingCache
from kvbench.adapters.hf.models import LoadedModel
from kvbench.adapters.hf.teacher import teacher_force
from kvbench.core.contract import EvictionView, Policy
from kvbench.core.schedule import Schedule
from kvbench.registry import make_policy

Trace = list[Tensor]
"""One [L, k, Hkv, K] int64 tensor of kept positions (sorted per head) per eviction event."""


class _DrawWatch:
    """A policy as the engine sees it, noting whether its scoring advanced any of the view's generators."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.drew = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def score(self, view: EvictionView) -> Tensor:
        before = [g.get_state() for g in view.rngs]
        scores = self.policy.score(view)
        self.drew |= any(not torch.equal(g.get_state(), s) for g, s in zip(view.rngs, before, strict=True))
        return scores


def kept_trace(
    loaded: LoadedModel,
    tokens: Sequence[int],
    prompt_len: int,
    policy: str,
    schedule: Schedule,
    row_seeds: Sequence[int],
    calibration: Any = None,
) -> tuple[Trace, bool]:
    """The kept positions after every eviction event of ``policy`` teacher-forced through ``tokens``, and
    whether the policy drew from its generators."""
    trace: Trace = []
    watched = _DrawWatch(make_policy(policy))

    def record(cache: EvictingCache) -> None:
        if cache.evictor.stats.events > len(trace):
            layers = [layer.slots.positions.sort(dim=-1).values for layer in cache.evicting_layers]
            trace.append(torch.stack(layers).cpu())

    teacher_force(
        loaded,
        tokens[:prompt_len],
        tokens[prompt_len:],
        cast(Policy, watched),
        schedule,
        row_seeds=row_seeds,
        calibration=calibration,
        on_step=record,
    )
    return trace, watched.drew


@dataclass(frozen=True)
class TraceComparison:
    events: int
    """Events compared (the longer trace's count: an event only one side had is a mismatch)."""
    equal_events: int
    """Events whose kept positions are identical in every layer, row and KV head."""
    kept_agreement: float
    """Mean share of kept positions common to both sides, over the events both had."""
    first_mismatch: dict[str, int] | None
    """The first differing event and layer, or None."""

    @property
    def equal(self) -> bool:
        return self.events > 0 and self.equal_events == self.events


def compare_traces(reference: Trace, other: Trace) -> TraceComparison:
    """How far ``other``'s kept positions match ``reference``'s, event by event."""
    events = max(len(reference), len(other))
    equal, shares, first = 0, [], None
    for event, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a.shape == b.shape and torch.equal(a, b):
            equal += 1
            shares.append(1.0)
            continue
        if first is None:
            pairs = enumerate(zip(a, b, strict=False))  # layers both have; a missing one differs
            differ = (i for i, (x, y) in pairs if x.shape != y.shape or not torch.equal(x, y))
            first = {"event": event, "layer": next(differ, min(len(a), len(b)))}
        shares.append(_overlap(a, b))
    if first is None and len(reference) != len(other):
        first = {"event": min(len(reference), len(other)), "layer": 0}
    agreement = sum(shares) / len(shares) if shares else 0.0
    return TraceComparison(events, equal, agreement, first)


def _overlap(a: Tensor, b: Tensor) -> float:
    """Share of a's kept positions that b keeps too, per (layer, row, head), averaged."""
    if a.shape[:-1] != b.shape[:-1]:
        return 0.0
    common = (a.unsqueeze(-1) == b.unsqueeze(-2)).any(dim=-1).float().mean()
    return float(common)

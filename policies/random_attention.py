"""Random Attention, the null baseline (Random Attention paper, Alg. 1).

score = U(0, 1) per (row, KV head, slot), redrawn at every event from the view's seeded generators.
With the prompt protected by the protocol, top-k of uniform noise keeps a uniformly random subset of
K − B candidates per KV head, independently per head and layer.

Recorded choices: the reference code draws from an unseeded global generator; we seed every draw from
(sample seed, layer, event).

See docs/policies.md#random (every built-in policy's math, sources and recorded choices).
"""

from __future__ import annotations

from torch import Tensor

from kvbench.core.contract import EvictionView, Policy, policy


@policy("random")
class RandomAttention(Policy):
    """Random Attention (null): evict uniformly at random per KV head."""

    def score(self, view: EvictionView) -> Tensor:
        _, heads, n = view.positions.shape
        return view.uniform(heads, n)

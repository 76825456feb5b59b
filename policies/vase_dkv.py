"""VASE-DKV (VASE paper, §3): leverage scores with a Gaussian projection redrawn at every eviction.

score = leverage(keys, G) · leverage(values, G), normalised over the candidates, with a fresh
G ~ N(0, 1)/√r ∈ R^{D×r} (r = 20) per layer, batch row and event, shared by the layer's KV heads.
Redrawing G averages the sketch's error out across events instead of freezing one bias (``curdkv``).

Recorded choice: the first ``sinks`` = 4 slots are always kept, as the VaSE code does: no effect when the
protocol protects them already, and the attention sinks survive under ``protection: none``.

See docs/policies.md#vase-dkv (every built-in policy's math, sources and recorded choices).
"""

from __future__ import annotations

from torch import Tensor

from kvbench.core.contract import EvictionView, Policy, policy
from kvbench.policies.scoring import gaussian_projection, leverage


@policy("vase-dkv")
class VaseDKV(Policy):
    """VASE-DKV: key·value leverage with a Gaussian projection redrawn at every event."""

    rank: int = 20
    sinks: int = 4

    def score(self, view: EvictionView) -> Tensor:
        g = gaussian_projection(view, self.rank)
        joint = leverage(view.keys, g) * leverage(view.values, g)
        scores = joint / joint.sum(dim=-1, keepdim=True).clamp(min=1e-30)
        return scores.masked_fill(view.positions < self.sinks, float("inf"))

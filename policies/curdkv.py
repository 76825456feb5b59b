"""CurDKV as run in the VASE code (Sengupta et al., 2025, "Value-Guided KV Compression ... CUR").

score = leverage(keys, G) · leverage(values, G), normalised to sum to 1 over the candidates per head,
with leverage(x, G) = ||x·G||², G ∈ R^{D×r}, G ~ N(0, 1)/√r, r = 20.

Recorded choices: random-projection leverage (no exact SVD) and no local windows, as in the VASE code;
G is drawn once per layer and batch row at the layer's first event, shared by its KV heads, and kept for
the rest of the sequence (contrast ``vase-dkv``, which redraws it at every event). The first ``sinks`` = 4
slots are always kept, as the VaSE code does: no effect when the protocol protects them already, and the
attention sinks survive under ``protection: none``.

See docs/policies.md#curdkv (every built-in policy's math, sources and recorded choices).
"""

from __future__ import annotations

from torch import Tensor

from kvbench.core.contract import EvictionView, Policy, policy
from kvbench.policies.scoring import gaussian_projection, leverage


@policy("curdkv")
class CurDKV(Policy):
    """CurDKV: key·value leverage scores with a fixed Gaussian projection per layer."""

    rank: int = 20
    sinks: int = 4

    def score(self, view: EvictionView) -> Tensor:
        if not view.state.has_row("projection"):
            view.state.set_row("projection", gaussian_projection(view, self.rank))
        g = view.state.row("projection")
        joint = leverage(view.keys, g) * leverage(view.values, g)
        scores = joint / joint.sum(dim=-1, keepdim=True).clamp(min=1e-30)
        return scores.masked_fill(view.positions < self.sinks, float("inf"))

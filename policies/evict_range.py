"""Ablation from the VASE paper: evict the largest-magnitude values first.

score = −value_range(values), value_range = max − min over the head dimension. The VASE paper reports
that this inversion of its value criterion collapses GSM8K accuracy (88% → 14%): kvbench keeps it as a
sanity check that value magnitude matters.

See docs/policies.md#evict-range (every built-in policy's math, sources and recorded choices).
"""

from __future__ import annotations

from torch import Tensor

from kvbench.core.contract import EvictionView, Policy, policy
from kvbench.policies.scoring import value_range


@policy("evict-range")
class EvictRange(Policy):
    """Ablation: evict the values with the largest range first (VASE)."""

    def score(self, view: EvictionView) -> Tensor:
        return -value_range(view.values)

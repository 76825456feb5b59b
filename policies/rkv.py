"""R-KV, simplified as in the VASE and Random Attention papers' tables (Cai et al., 2025, "R-KV").

score = λ·window_attention(avg5, mean) − (1 − λ)·key_redundancy(keys)

key_redundancy: cosine similarity of the candidate keys per KV head, diagonal zeroed, mean over each
row (divided by n), softmax over the slots. Computed in row chunks: no n×n matrix for large n.

Recorded choices: λ = 0.5 as in the papers' tables (the R-KV repository uses 0.1: see ``rkv-official``);
W = 64.

See docs/policies.md#rkv (every built-in policy's math, sources and recorded choices).
"""

from __future__ import annotations

from torch import Tensor

from kvbench.core.contract import EvictionView, WindowedPolicy, policy
from kvbench.policies.scoring import key_redundancy, window_attention


@policy("rkv", needs={"queries"})
class RKV(WindowedPolicy):
    """R-KV (papers' variant): attention importance minus key redundancy, λ = 0.5."""

    lam: float = 0.5
    """λ in λ·importance − (1 − λ)·redundancy."""
    window: int = 64

    def score(self, view: EvictionView) -> Tensor:
        importance = window_attention(self.recent_queries(view), view.keys, pool="avg5", group="mean")
        return self.lam * importance - (1.0 - self.lam) * key_redundancy(view.keys)

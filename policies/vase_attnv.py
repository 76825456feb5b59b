"""VASE-AttnV (VASE paper §3; ``range_sink_sample_attn`` in the VaSE code), prompt-protected as the
Random Attention paper ran it.

Reserve N_v = min(K/4, K − B − P) slots for the largest value ranges (max − min over D) among the
candidates the protocol does not protect (P of them are protected in that KV head); sample the rest of
the K − B kept candidates without replacement with probability proportional to
window_attention(avg5, mean) of the last W queries.

In scores: reserved slots get +inf; the others get log(attention) + Gumbel noise, whose top-k is exact
weighted sampling without replacement.

Recorded choices: K includes the buffer (N_v = 512 at K = 2048, as the VaSE scripts' token_budget/4).
``reserve = "unprotected"`` (the default) never spends a reserve slot on a token the protocol keeps
anyway; ``reserve = "all"`` is VaSE's original, which protects nothing: the reserve is chosen among all
candidates with the first ``sinks`` slots forced into it. We sample in fp32 with Gumbel top-k where the
reference samples with torch.multinomial, and every draw is seeded.

See docs/policies.md#vase-attnv (every built-in policy's math, sources and recorded choices).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from kvbench.core.contract import EvictionView, WindowedPolicy, policy
from kvbench.policies.scoring import gumbel_topk, value_range, window_attention


@policy("vase-attnv", needs={"queries"})
class VaseAttnV(WindowedPolicy):
    """VASE-AttnV: reserve the largest-range values, sample the rest by attention."""

    value_share: float = 0.25
    """N_v = floor(value_share · K), capped at the unprotected room K − B − P."""
    reserve: Literal["unprotected", "all"] = "unprotected"
    """Where the reserve is drawn from: the unprotected candidates, or all of them (VaSE's original)."""
    sinks: int = 4
    """With ``reserve = "all"``: the first slots, forced into the reserve."""
    window: int = 64

    def reserved(self, view: EvictionView) -> Tensor:
        """[B, Hkv, n] bool: the N_v reserved slots of each KV head."""
        n_reserved = min(int(self.value_share * view.budget), view.keep, view.num_candidates)
        ranges = value_range(view.values)
        if self.reserve == "all":
            ranking = ranges.masked_fill(view.positions < self.sinks, float("inf"))
            top = ranking.topk(n_reserved, dim=-1).indices
            return torch.zeros_like(ranking, dtype=torch.bool).scatter_(-1, top, True)
        ranking = ranges.masked_fill(view.protected, float("-inf"))
        best = ranking.topk(n_reserved, dim=-1)
        room = (view.keep - view.protected.sum(dim=-1, keepdim=True)).clamp(min=0)  # K − B − P per head
        rank = torch.arange(n_reserved, device=ranges.device)
        chosen = (rank < room) & (best.values > float("-inf"))
        return torch.zeros_like(ranking, dtype=torch.bool).scatter_(-1, best.indices, chosen)

    def score(self, view: EvictionView) -> Tensor:
        attention = window_attention(self.recent_queries(view), view.keys, pool="avg5", group="mean")
        return gumbel_topk(attention, view).masked_fill(self.reserved(view), float("inf"))

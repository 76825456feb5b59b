"""VASE-AttnV (VASE paper §3; ``range_sink_sample_attn`` in the VaSE code).

Reserve N_v = K/4 slots for the largest value ranges (max − min over D), the first 4 slots counting as
sinks inside N_v; sample the rest of the K − B kept candidates without replacement with probability
proportional to window_attention(avg5, mean) of the last W queries.

In scores: reserved slots get +inf; the others get log(attention) + Gumbel noise, whose top-k is exact
weighted sampling without replacement.

Recorded choices: K includes the buffer (N_v = 512 at K = 2048, as the VaSE scripts' token_budget/4);
the reserve is chosen among all candidates, protected ones included, as in the VaSE code (which protects
nothing); we sample in fp32 with Gumbel top-k where the reference samples with torch.multinomial, and
every draw is seeded.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kvbench.core.contract import EvictionView, Policy, policy
from kvbench.policies.scoring import gumbel_topk, value_range, window_attention


@policy("vase-attnv", needs={"queries"})
class VaseAttnV(Policy):
    """VASE-AttnV: reserve the largest-range values, sample the rest by attention."""

    value_share: float = 0.25
    """N_v = floor(value_share · K), capped at K − B."""
    sinks: int = 4
    window: int = 64

    @property
    def query_window(self) -> int:
        return self.window

    def reserved(self, view: EvictionView) -> Tensor:
        """[B, Hkv, n] bool: the sinks plus the largest value ranges, N_v slots in all."""
        n_reserved = min(int(self.value_share * view.budget), view.keep, view.num_candidates)
        ranking = value_range(view.values).masked_fill(view.positions < self.sinks, float("inf"))
        top = ranking.topk(n_reserved, dim=-1).indices
        return torch.zeros_like(ranking, dtype=torch.bool).scatter_(-1, top, True)

    def score(self, view: EvictionView) -> Tensor:
        attention = window_attention(view.queries[:, :, -self.window :], view.keys, pool="avg5", group="mean")
        return gumbel_topk(attention, view).masked_fill(self.reserved(view), float("inf"))

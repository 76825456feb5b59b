"""SnapKV at decode time (Li et al., 2024, "SnapKV: LLM Knows What You are Looking for Before Generation").

score = window_attention(last W queries, candidates, pool=avg5, group=mean), as in the VASE and Random
Attention code: softmax over the candidates per query head in fp32, mean over the W queries, average
pooling (kernel 5, padding 2) along the slots, mean over the GQA group.

Recorded choices: W = 64 (= the default buffer); the original prefill-time SnapKV uses a max-pool of
kernel 7 and a window of 32, both available as parameters.

See docs/policies.md#snapkv (every built-in policy's math, sources and recorded choices).
"""

from __future__ import annotations

from torch import Tensor

from kvbench.core.contract import EvictionView, WindowedPolicy, policy
from kvbench.policies.scoring import GroupReduce, Pool, window_attention


@policy("snapkv", needs={"queries"})
class SnapKV(WindowedPolicy):
    """SnapKV: attention of the last W queries, pooled along the slots."""

    window: int = 64
    pool: Pool = "avg5"
    group: GroupReduce = "mean"

    def score(self, view: EvictionView) -> Tensor:
        queries = self.recent_queries(view)
        return window_attention(queries, view.keys, pool=self.pool, group=self.group)

"""StreamingLLM (Xiao et al., 2023, "Efficient Streaming Language Models with Attention Sinks").

score = position: keep the most recent candidates. The attention sinks are not the policy's business:
use a protocol with ``sinks: 4`` protection, so that every policy compared with it gets the same sinks.

See docs/policies.md#streaming (every built-in policy's math, sources and recorded choices).
"""

from __future__ import annotations

from torch import Tensor

from kvbench.core.contract import EvictionView, Policy, policy


@policy("streaming")
class Streaming(Policy):
    """StreamingLLM: keep the most recent tokens (sinks come from the protocol)."""

    def score(self, view: EvictionView) -> Tensor:
        return view.positions.float()

"""H2O, heavy hitters plus a recent window (Zhang et al., 2023, "H2O: Heavy-Hitter Oracle for Efficient
Generative Inference").

acc[b, h, s] += Σ over the step's queries of mean over the GQA group of softmax(q·kᵀ/√D)[s], at every
forward step (prefill included), for every cached slot s; new slots start at 0. The newest
round(recent · K) slots are kept by recency, the buffer's B among them; the other candidates by acc:

    score = +inf for the newest round(recent · K) − B candidates, acc otherwise.

The accumulator is a per-slot state tensor: the engine extends it for new tokens and compacts it with
the cache, so it always follows its tokens. Recorded choices: recent = 0.5 is H2O's equal split of the
budget between recent and heavy-hitter tokens; the buffer counts towards the recent share (it is kept by
recency for every policy alike), so recent · K ≤ B adds no window; recent = 0 is pure accumulated
attention, under which a token leaving the buffer, having received about B queries' attention, rarely
outscores survivors that have accumulated thousands.

See docs/policies.md#h2o (every built-in policy's math, sources and recorded choices).
"""

from __future__ import annotations

import pydantic
from torch import Tensor

from kvbench.core.contract import EvictionView, Policy, StepView, policy


@policy("h2o", needs={"step_attention"})
class H2O(Policy):
    """H2O: a recent window plus the heavy hitters of accumulated attention."""

    recent: float = pydantic.Field(default=0.5, ge=0.0, le=1.0)
    """The share of K kept by recency, the buffer included."""

    def observe(self, step: StepView) -> None:
        batch, q_heads, q_len, slots = step.attention.shape
        kv_heads = step.model.num_kv_heads
        received = step.attention.float().view(batch, kv_heads, q_heads // kv_heads, q_len, slots)
        received = received.mean(dim=2).sum(dim=2)  # [B, Hkv, S]
        if not step.state.has_slot("acc"):
            step.state.register_slot("acc", received, fill=0.0)
        else:
            step.state.set_slot("acc", step.state.slot("acc") + received)

    def score(self, view: EvictionView) -> Tensor:
        acc = view.candidate_slot("acc").clone()
        buffer = view.budget - view.keep
        newest = min(max(round(self.recent * view.budget) - buffer, 0), view.num_candidates)
        if newest:
            acc.scatter_(-1, view.positions.topk(newest, dim=-1).indices, float("inf"))
        return acc

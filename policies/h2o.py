"""H2O, heavy hitters (Zhang et al., 2023, "H2O: Heavy-Hitter Oracle for Efficient Generative Inference").

acc[b, h, s] += Σ over the step's queries of mean over the GQA group of softmax(q·kᵀ/√D)[s], at every
forward step (prefill included), for every cached slot s; new slots start at 0. score = acc.

The accumulator is a per-slot state tensor: the engine extends it for new tokens and compacts it with
the cache, so it always follows its tokens. Recorded choice: no recent-window split inside the policy;
the schedule's buffer plays the role of H2O's recent tokens for every policy alike.
"""

from __future__ import annotations

from torch import Tensor

from kvbench.core.contract import EvictionView, Policy, StepView, policy


@policy("h2o", needs={"step_attention"})
class H2O(Policy):
    """H2O: accumulated attention received by each token since it entered the cache."""

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
        return view.candidate_slot("acc").clone()

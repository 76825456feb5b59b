"""Full cache: the reference arm that never evicts (the engine bypasses eviction for it;
docs/policies.md#full)."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from kvbench.core.contract import EvictionView, Policy, policy


@policy("full")
class Full(Policy):
    """Full cache, no eviction: the upper reference every policy is compared with."""

    evicts: ClassVar[bool] = False

    def score(self, view: EvictionView) -> Tensor:
        raise RuntimeError("policy 'full' never evicts; the engine must not ask it for scores")

"""kvbench: a benchmark for decode-time KV-cache eviction policies, with Random Attention as the null.

A scorer author writes ``from kvbench import policy, Policy, EvictionView``. Those names are resolved on
first use, so that the parts of kvbench that only read results (the leaderboard) never import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["EvictionView", "LayerState", "ModelFacts", "Policy", "StepView", "__version__", "policy"]

if TYPE_CHECKING:
    from kvbench.core.contract import EvictionView, LayerState, ModelFacts, Policy, StepView, policy


def __getattr__(name: str) -> Any:
    if name in __all__ and name != "__version__":
        from kvbench.core import contract

        return getattr(contract, name)
    raise AttributeError(f"module 'kvbench' has no attribute {name!r}")

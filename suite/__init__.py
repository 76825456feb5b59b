"""kvbench: a benchmark for decode-time KV-cache eviction policies, with Random Attention as the null."""

from kvbench.contract import EvictionView, LayerState, ModelFacts, Policy, StepView, policy

__version__ = "0.1.0"

__all__ = ["EvictionView", "LayerState", "ModelFacts", "Policy", "StepView", "__version__", "policy"]

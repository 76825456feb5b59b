"""Backends that run a policy inside a model: ``hf`` (transformers) and ``vllm``. The tests' model-free
backend (random tensors) lives with the tests, in tests/synthetic_adapter.py: it is not installed."""

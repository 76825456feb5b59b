"""Backends that run a policy inside a model: ``synthetic`` (random tensors, for engine tests and
benchmarks), ``hf`` (transformers) and ``vllm``."""

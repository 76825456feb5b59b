"""The vLLM backend: kvbench's policies and schedule on vLLM's paged KV cache (README, "The vLLM backend").

- ``paged_schedule``, ``paged_kv``, ``request_eviction``: pure torch, no vLLM import (tested everywhere);
- ``request_config``: what each request carries to the engine's processes;
- ``guard``: the pinned version, the private surface and the settings that are refused;
- ``scheduler``, ``runner``, ``worker``, ``attention``, ``plugin``: the parts vLLM loads;
- ``backend``: the adapter the runner sees; ``checkpoint``: a model spec as a folder vLLM can load.
"""

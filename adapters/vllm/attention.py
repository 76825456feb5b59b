"""Query capture: vLLM's attention backend, recording post-RoPE queries for the policies that read them.

vLLM's official way to change a backend is ``register_backend``; kvbench's plugin registers this
subclass in place of the platform's backend (CPU_ATTN here; FLASH_ATTN on a GPU) while kvbench runs an
engine. The kernel is untouched: after it runs, the layer's queries are handed to the capture that the
evicting runner attached to the layer (runner.py), which keeps each request's last W rows.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

from kvbench.adapters.vllm.paged_kv import key_value_views
from kvbench.errors import CapabilityError


class CapturingCPUAttentionImpl(CPUAttentionBackendImpl):
    def forward(self, layer: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        output = super().forward(layer, query, *args, **kwargs)
        capture = getattr(layer, "kvbench_capture", None)
        if capture is not None and capture.plan:
            capture.record(layer.kvbench_layer, query)
        return output


class CapturingCPUAttention(CPUAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[CapturingCPUAttentionImpl]:
        return CapturingCPUAttentionImpl


def verify_cpu_layout(isa: str, dtype: torch.dtype, block_size: int, head_dim: int) -> None:
    """Write known keys and values through the kernel's own cache update and read them back through
    kvbench's views: a kernel that lays pages out differently stops the engine here, not in the results."""
    from vllm import _custom_ops as ops

    cache = torch.zeros(2, 1, block_size, 2 * head_dim, dtype=dtype)
    key_pages, value_pages = cache.view(2, 1, 2 * block_size, head_dim).chunk(2, dim=2)
    count = block_size + 3
    keys = torch.randn(count, 1, head_dim).to(dtype)
    values = torch.randn(count, 1, head_dim).to(dtype)
    slots = torch.arange(count)
    ops.cpu_attn_reshape_and_cache(
        keys, values, key_pages, value_pages, slots, isa, k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto"
    )
    key_view, value_view = key_value_views(cache, "cpu")
    blocks, offsets = slots // block_size, slots % block_size
    if not (
        torch.equal(key_view[blocks, :, offsets], keys)
        and torch.equal(value_view[blocks, :, offsets], values)
    ):
        raise CapabilityError(
            f"vLLM's CPU attention kernel (isa {isa!r}) lays out KV pages in a way kvbench's compaction does "
            "not know; it was checked against the 'vec' kernels"
        )

"""kvbench's ``vllm.general_plugins`` entry point: vLLM calls it in every process it starts.

It does nothing unless kvbench started the engine (``KVBENCH_VLLM=1``), so installing kvbench beside
vLLM changes nobody else's engine. When it acts, it checks the vLLM version and puts the capturing
attention backend in place of the platform's (attention.py).
"""

from __future__ import annotations

import os

ACTIVE = "KVBENCH_VLLM"


def register() -> None:
    if os.environ.get(ACTIVE) != "1":
        return
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from kvbench.adapters.vllm.guard import check_private_surface, check_version

    check_version()
    check_private_surface()
    if current_platform.is_cpu():
        register_backend(
            AttentionBackendEnum.CPU_ATTN, "kvbench.adapters.vllm.attention.CapturingCPUAttention"
        )

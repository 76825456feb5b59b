"""The eviction path's hardware-dependent choices, made from the machine it runs on, in one place that the
engine's policies and ``kvbench bench evict`` both ask, and that a run's manifest records.

One choice today: the dtype of R-KV's near-duplicate screen (kvbench.policies.near_duplicates). bfloat16
halves the bytes and, on a CPU with bf16 units (AMX, AVX-512 BF16) or a GPU, multiplies several times
faster than fp32; on a CPU without them (AVX2-only x86, many ARM cores) torch emulates it, about ten times
slower than fp32 (measured on an AVX2-only AMD EPYC: one 2048 × 2048 × 128 product, 19 ms fp32 and 207 ms
bf16). Either dtype gives the same kept positions: the screen only decides which pairs are computed
exactly, with a margin wider than its dtype's rounding. On a CPU that has bf16 units, a micro-measurement
decides, because an environment switch (``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY``) or a virtual
machine can withhold them from torch while the CPU still reports them.
"""

from __future__ import annotations

import functools
import os
import platform
import time

import torch

SCREEN_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FORCE_SCREEN = "KVBENCH_SCREEN_DTYPE"
"""An environment variable that sets the screen's dtype (float32 or bfloat16), for a comparison on one
machine; unset, the machine decides."""


def screen_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype R-KV's near-duplicate screen multiplies in on ``device``."""
    return SCREEN_DTYPES[_screen(torch.device(device).type)[0]]


def eviction_choices(device: str = "cpu") -> dict[str, str]:
    """What a manifest records: each choice and why it was made."""
    name, why = _screen(torch.device(device).type)
    return {"near_duplicate_screen": name, "near_duplicate_screen_why": why}


@functools.cache
def _screen(device_type: str) -> tuple[str, str]:
    forced = os.environ.get(FORCE_SCREEN)
    if forced:
        if forced not in SCREEN_DTYPES:
            raise ValueError(f"{FORCE_SCREEN}={forced!r}: use one of {', '.join(SCREEN_DTYPES)}, or unset it")
        return forced, f"set by {FORCE_SCREEN}"
    if device_type != "cpu":
        return "bfloat16", f"a {device_type} device multiplies bf16 natively"
    x86 = platform.machine() in ("x86_64", "AMD64")
    if x86 and not (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()):
        return "float32", "this CPU has no bf16 units (no AMX, no AVX-512 BF16): torch would emulate bf16"
    fp32, bf16 = _product_ms(torch.float32), _product_ms(torch.bfloat16)
    chosen = "bfloat16" if bf16 < fp32 else "float32"
    return chosen, f"measured here: one 1024 × 512 × 128 product {fp32:.2f} ms fp32, {bf16:.2f} ms bf16"


def product_gflops(dtype: torch.dtype) -> float:
    """This machine's rate, in GFLOP/s on one thread, for a product of the screen's shape in ``dtype``."""
    return 2 * 1024 * 512 * 128 / _product_ms(dtype) / 1e6


def _product_ms(dtype: torch.dtype) -> float:
    """The fastest of a few products of the screen's shape, on one thread as the bench times them."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(1024, 128, generator=generator).to(dtype)
    columns = torch.randn(512, 128, generator=generator).to(dtype)
    out = torch.empty(1024, 512, dtype=dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = float("inf")
        for _ in range(6):
            tick = time.perf_counter()
            torch.mm(rows, columns.mT, out=out)
            best = min(best, (time.perf_counter() - tick) * 1e3)
        return best
    finally:
        torch.set_num_threads(threads)

"""The eviction path's hardware-dependent choices, made from the machine it runs on, in one place that the
engine's policies and ``kvbench bench evict`` both ask, and that a run's manifest records.

Two choices, both for R-KV's near-duplicate screen (kvbench.policies.near_duplicates), and neither ever
changes a kept position: the screen only decides which pairs of keys are computed exactly in fp32.

- **Its dtype.** bfloat16 halves the bytes and, on a CPU with bf16 units (AMX, AVX-512 BF16) or a GPU,
  multiplies several times faster than fp32; on a CPU without them (AVX2-only x86, many ARM cores) torch
  emulates it, about ten times slower than fp32 (measured on an AVX2-only AMD EPYC: one 2048 × 2048 × 128
  product, 19 ms fp32 and 207 ms bf16). A CPU that reports bf16 units is measured, because an environment
  switch (``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY``) or a virtual machine can withhold them from
  torch while the CPU still reports them.
- **Its strip width**: how many columns one product of the symmetric screen takes. Narrow strips compute
  less of the square, wide ones run at a higher rate; which wins depends on the CPU's caches and kernels,
  so the machine measures it.

A measurement is made once per machine and kept in the cache folder (``hardware.json``), keyed by what
decides torch's kernels: the CPU model, its vector capability as torch uses it, the ISA switches and
torch's version. A run reads it back in microseconds; where the cache folder cannot be written (a
sandbox), the process measures for itself (a few tenths of a second).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kvbench.cache_folder import cache_root
from kvbench.errors import SpecError

SCREEN_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FORCE_SCREEN = "KVBENCH_SCREEN_DTYPE"
"""An environment variable that sets the screen's dtype (float32 or bfloat16), for a comparison on one
machine; unset, the machine decides."""

STRIPS = (256, 512, 1024)
"""The strip widths measured: multiples of the screen's block of columns (near_duplicates.COLUMNS)."""

DEFAULT_STRIP = 512
"""The strip on a GPU, which runs any of these products far below its capacity: not measured."""

SCREEN_KEYS, SCREEN_DIM = 2048, 128
"""The shape each measurement screens: the bench's budget and a common head dimension."""

CHOICES_FILE = "hardware.json"
_MOST_BYTES = 1 << 20  # a larger hardware.json is not ours: measured again, and rewritten


def screen_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype R-KV's near-duplicate screen multiplies in on ``device``."""
    return SCREEN_DTYPES[_screen(torch.device(device).type)[0]]


def screen_strip(device: torch.device | str) -> int:
    """The columns per product of the symmetric screen on ``device``, in its screen dtype."""
    device_type = torch.device(device).type
    return _strip(device_type, _screen(device_type)[0])[0]


def eviction_choices(device: str = "cpu") -> dict[str, str | int]:
    """What a manifest records: each choice and why it was made."""
    device_type = torch.device(device).type
    name, why = _screen(device_type)
    strip, strip_why = _strip(device_type, name)
    return {
        "near_duplicate_screen": name,
        "near_duplicate_screen_why": why,
        "near_duplicate_strip": strip,
        "near_duplicate_strip_why": strip_why,
    }


@functools.cache
def _screen(device_type: str) -> tuple[str, str]:
    forced = os.environ.get(FORCE_SCREEN)
    if forced:
        if forced not in SCREEN_DTYPES:
            raise SpecError(f"{FORCE_SCREEN}={forced!r}: use one of {', '.join(SCREEN_DTYPES)}, or unset it")
        return forced, f"set by {FORCE_SCREEN}"
    if device_type != "cpu":
        return "bfloat16", f"a {device_type} device multiplies bf16 natively"
    x86 = platform.machine() in ("x86_64", "AMD64")
    if x86 and not (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()):
        return "float32", "this CPU has no bf16 units (no AMX, no AVX-512 BF16): torch would emulate bf16"

    def measure() -> dict[str, Any]:
        fp32, bf16 = _product_ms(torch.float32), _product_ms(torch.bfloat16)
        return {
            "value": "bfloat16" if bf16 < fp32 else "float32",
            "why": f"one 1024 × 512 × 128 product {fp32:.2f} ms fp32, {bf16:.2f} ms bf16",
        }

    found = _measured("screen", measure, lambda value: value in SCREEN_DTYPES)
    return str(found["value"]), found["why"]


@functools.cache
def _strip(device_type: str, dtype_name: str) -> tuple[int, str]:
    if device_type != "cpu":
        return DEFAULT_STRIP, f"the default on a {device_type} device (not measured)"
    dtype = SCREEN_DTYPES[dtype_name]

    def measure() -> dict[str, Any]:
        times = {strip: _screen_ms(dtype, strip) for strip in STRIPS}
        best = min(times, key=times.__getitem__)
        shown = ", ".join(f"{strip}: {ms:.1f} ms" for strip, ms in times.items())
        return {
            "value": best,
            "why": f"the whole screen of {SCREEN_KEYS} keys in {dtype_name}, by strip: {shown}",
        }

    found = _measured(f"strip-{dtype_name}", measure, lambda value: value in STRIPS)
    return int(found["value"]), found["why"]


def cpuinfo(field: str) -> str | None:
    """The first ``field`` line's value in /proc/cpuinfo (None off Linux)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    return None


def machine_key() -> str:
    """What decides torch's CPU kernels, and so which choice is fastest: a measurement made under another
    key is made again."""
    switches = " ".join(
        f"{name}={os.environ.get(name, '')}" for name in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
    )
    model = cpuinfo("model name") or platform.processor() or "unknown"
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{model} | {platform.machine()} | {capability} | {switches} | torch {torch.__version__}"


def _measured(
    name: str, measure: Callable[[], dict[str, Any]], valid: Callable[[Any], bool]
) -> dict[str, Any]:
    """This machine's kept measurement ``name`` (with "measured here …" in its why), measured and kept
    when there is none or it is not one of the valid values."""
    path, key = cache_root() / CHOICES_FILE, machine_key()
    kept = _read(path)
    found = kept.get(key, {}).get(name)
    if isinstance(found, dict) and valid(found.get("value")) and isinstance(found.get("why"), str):
        return {"value": found["value"], "why": f"measured on this machine before: {found['why']}"}
    found = measure()
    kept = _read(path)  # another process may have kept others meanwhile
    kept.setdefault(key, {})[name] = found
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{CHOICES_FILE}.{os.getpid()}")
        partial.write_text(json.dumps(kept, indent=1, sort_keys=True))
        partial.replace(path)
    return {"value": found["value"], "why": f"measured here: {found['why']}"}


def _read(path: Path) -> dict[str, dict[str, Any]]:
    with contextlib.suppress(OSError, ValueError, RecursionError):
        if path.stat().st_size <= _MOST_BYTES:
            kept = json.loads(path.read_text())
            if isinstance(kept, dict):
                return {key: value for key, value in kept.items() if isinstance(value, dict)}
    return {}


def product_gflops(dtype: torch.dtype) -> float:
    """This machine's rate, in GFLOP/s on one thread, for a product of the screen's shape in ``dtype``."""
    return 2 * 1024 * 512 * 128 / _product_ms(dtype) / 1e6


def _one_thread(run: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` calls of ``run``, in ms, on one thread as the bench times eviction."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = float("inf")
        for _ in range(repeats):
            tick = time.perf_counter()
            run()
            best = min(best, (time.perf_counter() - tick) * 1e3)
        return best
    finally:
        torch.set_num_threads(threads)


@functools.cache
def _product_ms(dtype: torch.dtype) -> float:
    """One product of the screen's strip shape (measured once per process)."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(1024, SCREEN_DIM, generator=generator).to(dtype)
    columns = torch.randn(512, SCREEN_DIM, generator=generator).to(dtype)
    out = torch.empty(1024, 512, dtype=dtype)
    return _one_thread(lambda: torch.mm(rows, columns.mT, out=out), repeats=6)


def _screen_ms(dtype: torch.dtype, strip: int) -> float:
    """The symmetric screen's products over SCREEN_KEYS keys in strips of ``strip`` columns, as
    near_duplicates computes them: each strip against the rows from its first on."""
    keys = torch.randn(SCREEN_KEYS, SCREEN_DIM, generator=torch.Generator().manual_seed(0)).to(dtype)
    space = torch.empty(SCREEN_KEYS * strip, dtype=dtype)

    def screen() -> None:
        for start in range(0, SCREEN_KEYS, strip):
            width = min(strip, SCREEN_KEYS - start)
            out = space[: (SCREEN_KEYS - start) * width].view(SCREEN_KEYS - start, width)
            torch.mm(keys[start:], keys[start : start + width].mT, out=out)

    return _one_thread(screen, repeats=4)

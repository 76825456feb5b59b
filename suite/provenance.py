"""Provenance: what every result records about where it came from, in one place.

The machine (CPU, threads, torch's build, and for a GPU its name, count, capability, memory, cuDNN and
driver), the library versions that decide outputs, Python, kvbench's version and its git commit. Runs'
manifests, `kvbench check`'s reference and the benchmarks all take it from here.
"""

from __future__ import annotations

import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

from kvbench.core.hardware import cpuinfo, eviction_choices

PACKAGES = ("torch", "transformers", "duckdb", "pyarrow", "numpy", "scipy", "pydantic")


def describe_machine(device: str = "cpu") -> dict[str, Any]:
    """The CPU, torch's build and, for a CUDA device, the GPU that ran: name, count, driver, CUDA."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": cpuinfo("model name") or platform.processor() or "unknown",
        "cpu_vector_features": _vector_features(),
        "cpu_count": os.cpu_count() or 0,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_threads": torch.get_num_threads(),
        "omp_spin": os.environ.get("GOMP_SPINCOUNT") or os.environ.get("OMP_WAIT_POLICY"),
        "device": device,
        "eviction_choices": eviction_choices(device),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        info["gpu"] = torch.cuda.get_device_name(index)
        info["gpu_count"] = torch.cuda.device_count()
        info["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(index)))
        info["gpu_memory_bytes"] = torch.cuda.get_device_properties(index).total_memory
        info["cudnn"] = torch.backends.cudnn.version()
        info["gpu_driver"] = _nvidia_driver()
    return info


def _nvidia_driver() -> str | None:
    """The NVIDIA driver version, from nvidia-smi (torch does not report it)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    return lines[0] if done.returncode == 0 and lines else None


def _vector_features() -> str | None:
    """The CPU's vector instruction sets (AVX, AVX-512 and its BF16/VNNI parts, AMX, FMA): two CPUs sold
    under one model name can differ here, and torch picks different kernels, which round differently."""
    flags = (cpuinfo("flags") or "").split()
    return " ".join(sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))) if flags else None


def git_state(where: Path) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    return {"sha": sha, "dirty": bool(git("status", "--porcelain")) if sha else None}


def provenance(device: str = "cpu") -> dict[str, Any]:
    import kvbench

    packages: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = None
    return {
        "kvbench": kvbench.__version__,
        "git": git_state(Path(kvbench.__file__).resolve().parent),
        "packages": packages,
        "python": platform.python_version(),
        "hardware": describe_machine(device),
    }

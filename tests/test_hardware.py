"""The eviction path's hardware choice (kvbench.core.hardware): fp32 where the CPU has no bf16 units, read
here from /proc/cpuinfo independently of torch; an explicit setting wins, and a bad one is named."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch

from kvbench.core import hardware


@pytest.fixture(autouse=True)
def fresh_choice():
    hardware._screen.cache_clear()
    yield
    hardware._screen.cache_clear()


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="reads x86 flags")
def test_the_screen_is_fp32_exactly_where_the_cpu_has_no_bf16_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hardware.FORCE_SCREEN, raising=False)
    choice = hardware.eviction_choices("cpu")
    if not cpu_flags() & {"amx_tile", "avx512_bf16"}:
        assert choice["near_duplicate_screen"] == "float32"
        assert "no bf16 units" in choice["near_duplicate_screen_why"]
        assert hardware.screen_dtype("cpu") is torch.float32
    else:  # the machine measures, and says what it measured
        assert choice["near_duplicate_screen_why"].startswith("measured here: ")


def test_a_setting_wins_and_a_bad_one_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hardware.FORCE_SCREEN, "bfloat16")
    assert hardware.screen_dtype("cpu") is torch.bfloat16
    assert hardware.eviction_choices()["near_duplicate_screen_why"] == "set by KVBENCH_SCREEN_DTYPE"
    hardware._screen.cache_clear()
    monkeypatch.setenv(hardware.FORCE_SCREEN, "fp8")
    with pytest.raises(ValueError, match="KVBENCH_SCREEN_DTYPE='fp8': use one of float32, bfloat16"):
        hardware.screen_dtype("cpu")


def test_a_gpu_screens_in_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hardware.FORCE_SCREEN, raising=False)
    assert hardware._screen("cuda")[0] == "bfloat16"

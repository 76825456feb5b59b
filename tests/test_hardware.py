"""The eviction path's hardware choices (kvbench.core.hardware): fp32 where the CPU has no bf16 units, read
here from /proc/cpuinfo independently of torch; the strip width measured once per machine and kept in the
cache folder; an explicit setting wins, and a bad one is named."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest
import torch

from kvbench.core import hardware
from kvbench.errors import SpecError


@pytest.fixture(autouse=True)
def fresh_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(hardware.FORCE_SCREEN, raising=False)
    hardware._screen.cache_clear()
    hardware._strip.cache_clear()
    yield
    hardware._screen.cache_clear()
    hardware._strip.cache_clear()


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="reads x86 flags")
def test_the_screen_is_fp32_exactly_where_the_cpu_has_no_bf16_units() -> None:
    choice = hardware.eviction_choices("cpu")
    if not cpu_flags() & {"amx_tile", "avx512_bf16"}:
        assert choice["near_duplicate_screen"] == "float32"
        assert "no bf16 units" in str(choice["near_duplicate_screen_why"])
        assert hardware.screen_dtype("cpu") is torch.float32
    else:  # the machine measures, and says what it measured
        assert str(choice["near_duplicate_screen_why"]).startswith("measured here: ")


def test_the_strip_is_the_fastest_measured_and_kept_for_the_next_process(tmp_path: Path) -> None:
    choice = hardware.eviction_choices("cpu")
    why = str(choice["near_duplicate_strip_why"])
    assert why.startswith("measured here: the whole screen of 2048 keys")
    parts = (part.removesuffix(" ms").split(": ") for part in why.split("by strip: ")[1].split(", "))
    shown = {int(strip): float(ms) for strip, ms in parts}
    assert sorted(shown) == list(hardware.STRIPS)
    assert choice["near_duplicate_strip"] == min(shown, key=shown.__getitem__)

    kept = json.loads((tmp_path / "cache" / hardware.CHOICES_FILE).read_text())
    dtype = choice["near_duplicate_screen"]
    assert kept[hardware.machine_key()][f"strip-{dtype}"]["value"] == choice["near_duplicate_strip"]
    hardware._strip.cache_clear()  # as a new process: read back, not measured
    again = hardware.eviction_choices("cpu")
    assert again["near_duplicate_strip"] == choice["near_duplicate_strip"]
    assert str(again["near_duplicate_strip_why"]).startswith(
        "measured on this machine before: the whole screen"
    )


def test_a_kept_value_that_is_no_choice_or_another_machines_is_measured_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cache" / hardware.CHOICES_FILE
    path.parent.mkdir(parents=True)
    key = hardware.machine_key()
    path.write_text(json.dumps({key: {"strip-float32": {"value": 999, "why": "forged"}}}))
    monkeypatch.setenv(hardware.FORCE_SCREEN, "float32")
    assert hardware.screen_strip("cpu") in hardware.STRIPS
    assert str(hardware.eviction_choices()["near_duplicate_strip_why"]).startswith("measured here")
    # torch's kernels limited to AVX2: another key, so the measurement is made again and both are kept
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    hardware._strip.cache_clear()
    assert hardware.machine_key() != key
    assert str(hardware.eviction_choices()["near_duplicate_strip_why"]).startswith("measured here")
    assert set(json.loads(path.read_text())) == {key, hardware.machine_key()}
    path.write_text("{not json")  # a broken file is measured over, never a traceback
    hardware._strip.cache_clear()
    assert hardware.screen_strip("cpu") in hardware.STRIPS


def test_a_setting_wins_and_a_bad_one_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hardware.FORCE_SCREEN, "bfloat16")
    assert hardware.screen_dtype("cpu") is torch.bfloat16
    assert hardware.eviction_choices()["near_duplicate_screen_why"] == "set by KVBENCH_SCREEN_DTYPE"
    hardware._screen.cache_clear()
    monkeypatch.setenv(hardware.FORCE_SCREEN, "fp8")
    with pytest.raises(SpecError, match="KVBENCH_SCREEN_DTYPE='fp8': use one of float32, bfloat16"):
        hardware.screen_dtype("cpu")


def test_a_gpu_screens_in_bf16_in_the_default_strip() -> None:
    assert hardware._screen("cuda")[0] == "bfloat16"
    assert hardware._strip("cuda", "bfloat16")[0] == hardware.DEFAULT_STRIP

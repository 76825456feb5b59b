"""kvbench generate and calibrate, run as a user runs them."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import invoke


def kvbench(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    return invoke.kvbench(*args, cwd=cwd, env={**os.environ, **env})


def test_generate_prints_samples_and_eviction_statistics() -> None:
    result = kvbench(
        "generate",
        "--model",
        "tiny-qwen3",
        "--policy",
        "snapkv:window=8",
        "--budget",
        "48",
        "--buffer",
        "16",
        "--max-new-tokens",
        "90",
        "--samples",
        "2",
        "--temperature",
        "0.6",
        "--ignore-eos",
        "hello",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "sample 0 (length, 90 tokens)" in out and "sample 1 (length, 90 tokens)" in out
    assert "snapkv on tiny-qwen3: K=48, B=16" in out
    events = int(next(line for line in out.splitlines() if "eviction events" in line).split()[-2])
    assert events >= 3


def test_calibrate_then_generate_with_triattention(tmp_path: Path) -> None:
    missing = kvbench(
        "generate",
        "--model",
        "tiny-qwen3",
        "--policy",
        "triattention",
        "--budget",
        "48",
        "--buffer",
        "16",
        "hi",
        cwd=tmp_path,
    )
    assert missing.returncode == 2 and "kvbench calibrate --model tiny-qwen3" in missing.stderr
    made = kvbench("calibrate", "--model", "tiny-qwen3", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "runs" / "calibration" / "tiny-qwen3.safetensors").is_file()
    used = kvbench(
        "generate",
        "--model",
        "tiny-qwen3",
        "--policy",
        "triattention",
        "--budget",
        "48",
        "--buffer",
        "16",
        "--max-new-tokens",
        "80",
        "--ignore-eos",
        "hi",
        cwd=tmp_path,
    )
    assert used.returncode == 0, used.stderr


def test_generate_refuses_bad_input_clearly() -> None:
    small = kvbench(
        "generate", "--model", "tiny-qwen3", "--budget", "16", "--buffer", "8", "a long prompt here"
    )
    assert small.returncode == 2
    assert "leaves room to protect 7 prompt tokens, but the prompt has" in small.stderr
    unknown = kvbench("generate", "--model", "qwen9", "--budget", "128", "hi")
    assert unknown.returncode == 2 and "Known models:" in unknown.stderr and "smollm2-135m" in unknown.stderr
    offline = kvbench("generate", "--model", "qwen3-4b", "--budget", "128", "hi", HF_HUB_OFFLINE="1")
    assert offline.returncode == 2 and "not available offline" in offline.stderr
    hint = "hf download Qwen/Qwen3-4B --revision 1cfa9a7208912126459214e8b04321603b3df60c"
    assert hint in offline.stderr and "Traceback" not in offline.stderr


def test_an_unreachable_hub_fails_fast_with_the_download_command() -> None:
    """No HF_HUB_OFFLINE: the hub's endpoint does not answer (a closed local port stands for a machine
    without network), so the load fails at once instead of retrying for about 40 s."""
    started = time.perf_counter()
    hub = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}  # CI sets HF_HUB_OFFLINE=1
    offline = kvbench("generate", "--model", "qwen3-4b", "--budget", "128", "hi", **hub)
    assert offline.returncode == 2 and "hf download Qwen/Qwen3-4B" in offline.stderr, offline.stderr
    assert time.perf_counter() - started < 25  # the command's own start-up (torch, transformers) included

"""`make venv` takes torch's CPU build where Linux has no GPU, if PyTorch's CPU index answers in seconds,
and says which source it took and why (tools/torch_index.py, run before the venv exists)."""

from __future__ import annotations

import http.server
import importlib.util
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("torch_index", ROOT / "tools" / "torch_index.py")
assert _spec is not None and _spec.loader is not None
torch_index = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_index)

CPU = "https://download.pytorch.org/whl/cpu"


def _never_asked() -> bool:
    raise AssertionError("the CPU index is probed only on Linux without a GPU or TORCH_INDEX")


def test_no_gpu_on_linux_takes_the_cpu_index_beside_the_default_one() -> None:
    choice = torch_index.choose("", "Linux", None, lambda: True)
    assert choice.arguments == ["--extra-index-url", CPU]
    assert choice.reason == f"no GPU here: torch's CPU build, from {CPU}"


def test_an_unreachable_cpu_index_keeps_the_configured_indexes_with_a_warning() -> None:
    choice = torch_index.choose("", "Linux", None, lambda: False)
    assert choice.arguments == []
    assert choice.reason.startswith(f"warning: no GPU here, but {CPU} did not answer within 5 s")
    assert choice.reason.endswith("To choose the index: make venv TORCH_INDEX=URL")


def test_a_gpu_a_given_index_or_another_system_never_probe() -> None:
    gpu = "GPU 0: NVIDIA H100 80GB HBM3"
    assert torch_index.choose("", "Linux", gpu, _never_asked) == (
        [],
        f"torch from the default index, a CUDA build ({gpu})",
    )
    given = "https://download.pytorch.org/whl/cu128"
    assert torch_index.choose(given, "Linux", None, _never_asked).arguments == ["--index-url", given]
    assert torch_index.choose("", "Darwin", None, _never_asked).arguments == []


@pytest.fixture
def listening() -> Iterator[tuple[str, str]]:
    """A real HTTP server and a socket that accepts connections but never answers, on localhost."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        yield f"http://127.0.0.1:{server.server_port}/", f"http://127.0.0.1:{silent.getsockname()[1]}/"
    finally:
        server.shutdown()
        silent.close()


def test_the_probe_waits_seconds_not_pip_s_minutes(listening: tuple[str, str]) -> None:
    answering, silent = listening
    assert torch_index.answers(answering, seconds=5)
    started = time.monotonic()
    assert not torch_index.answers(silent, seconds=0.5)
    assert time.monotonic() - started < 2
    assert not torch_index.answers("http://kvbench.invalid/", seconds=2)  # no such name (RFC 2606)


def test_the_script_prints_pip_s_arguments_and_says_why_on_stderr() -> None:
    given = "https://example.org/whl/cpu"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "torch_index.py"), given],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"--index-url {given}\n"
    assert done.stderr == f"make venv: torch from TORCH_INDEX={given}\n"

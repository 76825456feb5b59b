"""Where `make venv` takes torch from: the pip arguments on stdout, the reason on stderr.

PyPI's torch 2.13.0 on Linux is a CUDA build (several GB, with the nvidia-* wheels); a machine without
a GPU wants the CPU build (about 200 MB) from PyTorch's CPU index. So, in this order:

- ``TORCH_INDEX`` given (the first argument): that index, as pip's ``--index-url``;
- not Linux: PyPI's torch (macOS and Windows wheels there are CPU builds already);
- an NVIDIA GPU (``nvidia-smi -L`` lists one): PyPI's torch, the CUDA build;
- no GPU: the CPU index as an ``--extra-index-url`` if it answers within a few seconds. pip then takes
  ``2.13.0+cpu`` from it (a local label sorts above the plain version ``torch==2.13.0`` also matches),
  and PyPI stays the index for everything else. If it does not answer, pip's configured indexes and
  find-links as they are, with a warning: a CPU wheel there (a mirror, a wheel folder) is still taken,
  otherwise the CUDA build.

Run by the system's python3 before the venv exists, so standard library only. Usage:
``python3 tools/torch_index.py [TORCH_INDEX]``.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable
from typing import NamedTuple

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_SECONDS = 5.0
"""How long the CPU index may take to answer. pip's own timeout can be minutes (and it retries), so
an unreachable index must be found out here, not by pip."""


class Choice(NamedTuple):
    arguments: list[str]
    """pip's arguments for the torch install."""
    reason: str
    """What `make venv` says, after "make venv: "."""


def choose(torch_index: str, system: str, gpu: str | None, cpu_index_answers: Callable[[], bool]) -> Choice:
    """The torch source from the facts of this machine; ``gpu`` is the GPU found (None: none)."""
    if torch_index:
        return Choice(["--index-url", torch_index], f"torch from TORCH_INDEX={torch_index}")
    if system != "Linux":
        return Choice([], f"torch from the default index ({system}: its torch is a CPU build)")
    if gpu is not None:
        return Choice([], f"torch from the default index, a CUDA build ({gpu})")
    if cpu_index_answers():
        return Choice(["--extra-index-url", CPU_INDEX], f"no GPU here: torch's CPU build, from {CPU_INDEX}")
    return Choice(
        [],
        f"warning: no GPU here, but {CPU_INDEX} did not answer within {PROBE_SECONDS:g} s, so torch comes "
        "from pip's configured indexes and find-links: a CPU wheel if they hold one, else the CUDA build "
        "(several GB; it runs on CPU too). To choose the index: make venv TORCH_INDEX=URL",
    )


def nvidia_gpu() -> str | None:
    """The first GPU ``nvidia-smi -L`` lists, or None (no nvidia-smi, no driver, no device)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line for line in listed.stdout.splitlines() if line.startswith("GPU")]
    return lines[0].split(" (UUID")[0] if listed.returncode == 0 and lines else None


def answers(url: str, seconds: float = PROBE_SECONDS) -> bool:
    """Whether ``url`` gives an HTTP response within ``seconds``, name lookup included (a socket timeout
    does not bound the lookup, so the request runs in a thread that is abandoned at the deadline)."""
    answered: list[bool] = []

    def request() -> None:
        try:
            with urllib.request.urlopen(url, timeout=seconds):
                answered.append(True)
        except (OSError, ValueError):
            pass

    worker = threading.Thread(target=request, daemon=True)
    worker.start()
    worker.join(seconds)
    return bool(answered)


def main() -> int:
    torch_index = sys.argv[1].strip() if len(sys.argv) > 1 else ""
    choice = choose(torch_index, platform.system(), nvidia_gpu(), lambda: answers(f"{CPU_INDEX}/torch/"))
    print(f"make venv: {choice.reason}", file=sys.stderr)
    print(" ".join(choice.arguments))
    return 0


if __name__ == "__main__":
    sys.exit(main())

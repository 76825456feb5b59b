"""What the submission tests share: the kvbench command, the user's scorer, and reading a bundle's
cells."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

from invoke import kvbench

KVBENCH = str(Path(sys.executable).parent / "kvbench")
HUB = Path(__file__).resolve().parents[1] / "fixtures" / "hub"
SCORER = textwrap.dedent(
    '''
    """A user's scorer, submitted with its source."""
    from kvbench import EvictionView, Policy, policy


    @policy("keys-norm")
    class KeysNorm(Policy):
        """Keep the keys with the largest norm."""

        def score(self, view: EvictionView):
            return view.keys.float().norm(dim=-1)
    '''
)


def cli(
    *args: str, cwd: Path, check: bool = True, tmpdir: Path | None = None, own_process: bool = False
) -> subprocess.CompletedProcess:
    """`kvbench ARGS`, in this process unless ``own_process``: a hostile scorer run as the submitter's own
    file patches whatever interpreter imports it, so its run gets a process of its own. ``tmpdir``: where
    kvbench extracts a bundle, which tempfile reads once per process, so that too gets one."""
    if not own_process and tmpdir is None:
        done = kvbench(*args, cwd=cwd)
    else:
        env = {**os.environ, "TMPDIR": str(tmpdir)} if tmpdir else None
        done = subprocess.run([KVBENCH, *args], capture_output=True, text=True, cwd=cwd, timeout=600, env=env)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def cells(bundle: Path) -> list[dict]:
    with tarfile.open(bundle) as archive:
        member = archive.extractfile("bundle.json")
        assert member is not None
        return json.loads(member.read())["cells"]


def run_of(bundle: Path, task: str, policy: str) -> str:
    (found,) = [c["run_id"] for c in cells(bundle) if c["label"].startswith(f"tiny-qwen3/{task}/{policy}@")]
    return found

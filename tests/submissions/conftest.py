"""A genuine submission: real runs of the seeded tiny Qwen3 (a user's scorer from a file, the null and
the full cache on passkey and fidelity; SnapKV on the private GPQA fixture), exported by `kvbench
export` into one bundle."""

from __future__ import annotations

from pathlib import Path

import pytest
from built import built_once
from submitting import HUB, SCORER, cli


@pytest.fixture(scope="session")
def submission(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the submitter's results, with the bundle at ``bundle.kvbench.tar.gz`` (built once per
    test run: copy it before changing it)."""
    return built_once(tmp_path_factory, "submitter", _build)


def _build(root: Path) -> Path:
    (root / "keys_norm.py").write_text(SCORER)
    cli(
        *("run", "--model", "tiny-qwen3", "--task", "passkey", "--task", "fidelity"),
        *("--policy", "keys_norm.py:KeysNorm", "--limit", "3", "--quiet"),
        cwd=root,
    )
    cli(
        *("run", "--model", "tiny-qwen3", "--task", "gpqa-diamond", "--data", str(HUB / "Idavidrein/gpqa")),
        *("--policy", "snapkv", "--budget", "384", "--max-new-tokens", "16", "--limit", "2", "--quiet"),
        cwd=root,
    )
    cli(
        *(
            "export",
            "bundle.kvbench.tar.gz",
            "--scorer",
            "keys_norm.py",
            "--submitter",
            "tests <t@example.org>",
        ),
        cwd=root,
    )
    return root
